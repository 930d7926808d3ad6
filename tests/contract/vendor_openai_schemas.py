"""Re-vendor the OpenAI schemas the contract tests check against (needs PyYAML; run by hand).

Usage: python tests/contract/vendor_openai_schemas.py ../shared/reference/openai-openapi.yaml
"""

import json
import sys
from pathlib import Path

import yaml

NAMES = ("Batch", "BatchError", "BatchRequestCounts", "OpenAIFile", "Model", "Error", "DeleteFileResponse",
         "BatchRequestOutput")


def main() -> None:
    spec = yaml.safe_load(Path(sys.argv[1]).read_text())
    schemas = spec["components"]["schemas"]
    vendored = {name: schemas[name] for name in NAMES if name in schemas}
    target = Path(__file__).with_name("openai_schemas.json")
    target.write_text(json.dumps(vendored, indent=1, sort_keys=True, default=str) + "\n")
    print(f"wrote {len(vendored)} schemas to {target}")


if __name__ == "__main__":
    main()
