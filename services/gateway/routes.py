"""The route table."""

from aiohttp import web

from services.gateway.views import batches, errors, events, files, models


async def healthz(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


ROUTES = [
    web.get("/healthz", healthz),
    web.get("/v1/models", models.list_models),
    web.get("/v1/models/{model_id}", models.retrieve_model),
    web.post("/v1/files", files.create_file),
    web.get("/v1/files", files.list_files),
    web.get("/v1/files/{file_id}", files.retrieve_file),
    web.get("/v1/files/{file_id}/content", files.file_content),
    web.delete("/v1/files/{file_id}", files.delete_file),
    web.post("/v1/batches", batches.create_batch),
    web.get("/v1/batches", batches.list_batches),
    web.get("/v1/batches/{batch_id}", batches.retrieve_batch),
    web.post("/v1/batches/{batch_id}/cancel", batches.cancel_batch),
    web.get("/v1/batches/{batch_id}/events", events.stream_batch_events),
    web.get("/v1/batches/{batch_id}/errors", errors.batch_errors),
]
