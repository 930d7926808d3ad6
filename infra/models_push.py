"""`sheshnag models push FILE --id ID`: a model file uploaded into the deployment's object store under `models/`,
and the catalogue entry naming it with its SHA-256 printed, for the operator to add to the catalogue file."""

import argparse
import asyncio
import hashlib
import json
import sys
from pathlib import Path
from typing import get_args

from contracts.catalogue import MODEL_OBJECTS_PREFIX, OBJECT_SCHEME, CatalogueModel
from contracts.events.executor import EngineName
from services.runtime.process.settings import ConnectionSettings
from services.runtime.storage.objectstore import UPLOAD_PART_BYTES, ObjectStore

DEFAULT_ENDPOINTS = ["/v1/chat/completions", "/v1/completions", "/v1/responses"]
ENTRY_FIELDS = ("id", "engine", "artifact", "sha256", "context_length", "slots", "memory_bytes", "endpoints",
                "batchable", "owned_by")


class FileChanged(RuntimeError):
    """The file's bytes changed while it was uploaded: the object would not match the hash printed."""


def add_arguments(models: argparse.ArgumentParser) -> None:
    tools = models.add_subparsers(dest="tool", required=True)
    push = tools.add_parser("push", help="upload a model file (e.g. a GGUF) into the object store and print its "
                            "catalogue entry, sha256 pinned (S3 credentials from SHESHNAG_S3_*)")
    push.add_argument("file", type=Path)
    push.add_argument("--id", dest="model_id", required=True, help="the catalogue id")
    push.add_argument("--key", default=None, help=f"the object key, under {MODEL_OBJECTS_PREFIX} "
                      f"(default {MODEL_OBJECTS_PREFIX}<id>/<sha256 prefix>/<file name>: a new file never "
                      "replaces the object an older catalogue pins)")
    push.add_argument("--engine", default="llamacpp", choices=get_args(EngineName))
    push.add_argument("--context-length", type=int, default=2048)
    push.add_argument("--slots", type=int, default=8)
    push.add_argument("--memory-bytes", type=int, default=None,
                      help="weights plus KV cache (default: twice the file's size; measure and set it)")
    push.add_argument("--endpoint", dest="endpoints", action="append", default=None,
                      help=f"an endpoint it serves, once per endpoint (default {' '.join(DEFAULT_ENDPOINTS)})")


def models_tool(args: argparse.Namespace) -> int:
    connection = ConnectionSettings()
    if not connection.s3_access_key:
        print("sheshnag models push: needs the object store's credentials (SHESHNAG_S3_ENDPOINT, "
              "SHESHNAG_S3_ACCESS_KEY, SHESHNAG_S3_SECRET_KEY, SHESHNAG_S3_BUCKET)", file=sys.stderr)
        return 2
    try:
        model = asyncio.run(_push(connection, args))
    except (OSError, ValueError, FileChanged) as error:
        print(f"sheshnag models push: {error}", file=sys.stderr)
        return 1
    print(entry_toml(model), end="")
    return 0


async def _push(connection: ConnectionSettings, args: argparse.Namespace) -> CatalogueModel:
    store = ObjectStore.from_settings(connection)
    try:
        await store.ensure_bucket()
        return await push_model(store, args.file, args.model_id, key=args.key, engine=args.engine,
                                context_length=args.context_length, slots=args.slots, memory_bytes=args.memory_bytes,
                                endpoints=args.endpoints)
    finally:
        store.close()


async def push_model(store: ObjectStore, path: Path, model_id: str, *, key: str | None = None,
                     engine: EngineName = "llamacpp", context_length: int = 2048, slots: int = 8,
                     memory_bytes: int | None = None, endpoints: list[str] | None = None) -> CatalogueModel:
    """Upload `path` as a model object (streamed, in parts) and return its catalogue entry, sha256 pinned."""
    digest, size = await asyncio.to_thread(_sha256_of, path)
    key = key or f"{MODEL_OBJECTS_PREFIX}{model_id}/{digest[:12]}/{path.name}"
    model = CatalogueModel(id=model_id, engine=engine, artifact=f"{OBJECT_SCHEME}{key}", sha256=digest,
                           context_length=context_length, slots=slots,
                           memory_bytes=memory_bytes or 2 * size,
                           endpoints=endpoints or DEFAULT_ENDPOINTS)  # validated before anything is sent
    upload = store.writer(key, "application/octet-stream")
    sent = hashlib.sha256()
    file = await asyncio.to_thread(path.open, "rb")
    try:
        while part := await asyncio.to_thread(file.read, UPLOAD_PART_BYTES):
            sent.update(part)
            await upload.write(part)
        if sent.hexdigest() != digest:
            raise FileChanged(f"{path} changed while it was uploaded; push it again once it is complete")
        await upload.finish()
    except BaseException:
        await upload.abort()
        raise
    finally:
        file.close()
    return model


def entry_toml(model: CatalogueModel) -> str:
    """The model's `[[models]]` table for the catalogue file."""
    values = model.model_dump(include=set(ENTRY_FIELDS))
    lines = ["[[models]]"] + [f"{name} = {json.dumps(values[name])}" for name in ENTRY_FIELDS]
    return "\n".join(lines) + "\n"  # JSON's strings, numbers, booleans and lists of strings are TOML's too


def _sha256_of(path: Path) -> tuple[str, int]:
    with path.open("rb") as file:
        return hashlib.file_digest(file, "sha256").hexdigest(), path.stat().st_size
