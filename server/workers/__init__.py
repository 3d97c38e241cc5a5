"""Background work every server process runs beside its handlers: the video worker, on
leases (one process at a time per row) and one stop-aware loop."""
