"""Background work every server process runs beside its handlers: the video worker and the
webhook dispatcher, on leases (one process at a time per row) and one stop-aware loop."""
