"""One router per resource; ``api_router`` gathers them under ``/api/v1``."""
