import os as _os

# grpc's C core reads these when it starts (on the first import of grpc, which follows this
# package's): errors only, and none of the tracers that print request headers (an
# Authorization header carries an API key), whatever the environment asks for.
_os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
_HEADER_TRACERS = {"all", "api", "call", "call_error", "channel", "http", "http1"}
if _os.environ.get("GRPC_TRACE"):
    _os.environ["GRPC_TRACE"] = ",".join(
        t
        for t in _os.environ["GRPC_TRACE"].split(",")
        if t.strip()
        and t.strip().lstrip("-") not in _HEADER_TRACERS
        and not t.strip().startswith(("http2", "chttp2"))
    )
