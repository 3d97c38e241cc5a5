"""Bring your own key: a workspace's own provider keys (sealed at rest), the order in which
a request tries them around the operator's endpoints, and the platform fee on their use."""
