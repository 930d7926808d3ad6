"""A line refused by validation, as recorded for a partial batch (one JSON object per line), and its line of the
batch's error file."""

from pydantic import BaseModel

from contracts.api.output_line import OutputError, OutputLine, OutputResponse
from contracts.ids import batch_request_id, derived_id

DUPLICATE_CUSTOM_ID = "duplicate_custom_id"
"""The code of a line whose custom_id an earlier line of the file already used."""
REFUSED_STATUS = 400
"""What the regular endpoint would have answered a refused line."""


class RejectedLine(BaseModel):
    line: int
    """1-based line of the input file."""
    custom_id: str | None
    code: str
    """A validation code (see `LineRejected.code`)."""
    param: str | None = None
    message: str

    def ident(self) -> str:
        """Its name in the files: its custom_id, or its line when it has none or repeats an earlier line's."""
        return self.custom_id if self.custom_id is not None and self.code != DUPLICATE_CUSTOM_ID else \
            f"line:{self.line}"

    def error_line(self, batch_id: str) -> OutputLine:
        """Its error-file line: OpenAI's `error`, the 400 the regular call would have answered as `response` (so a
        program reads its cause as from a single call), and its 1-based input `line`."""
        ident = self.ident()
        body: dict[str, object] = {"error": {"message": self.message, "type": "invalid_request_error",
                                             "param": self.param, "code": self.code}}
        return OutputLine(id=batch_request_id(batch_id, ident), custom_id=self.custom_id,
                          response=OutputResponse(status_code=REFUSED_STATUS,
                                                  request_id=derived_id("req_", batch_id, ident), body=body),
                          error=OutputError(code=self.code, message=self.message), line=self.line)
