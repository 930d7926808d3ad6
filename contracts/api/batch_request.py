"""The body of `POST /v1/batches`, as the OpenAI SDK sends it (plus Sheshnag's `allow_partial` and `hold`); each
field names the error code a bad value of it gets."""

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, Strict, StringConstraints

from contracts.api.batch import SUPPORTED_ENDPOINTS, Endpoint, Placement
from contracts.api.field_errors import refused_as

MIN_EXPIRES_AFTER_S, MAX_EXPIRES_AFTER_S = 3600, 30 * 24 * 3600
MAX_METADATA_PAIRS = 16
MetadataKey = Annotated[str, StringConstraints(max_length=64)]
MetadataValue = Annotated[str, StringConstraints(max_length=512)]


class ExpiresAfter(BaseModel):
    model_config = ConfigDict(extra="forbid")

    anchor: Literal["created_at"]
    seconds: Annotated[int, Strict(), Field(ge=MIN_EXPIRES_AFTER_S, le=MAX_EXPIRES_AFTER_S)]
    """How long after creation the file expires."""


DEFAULT_WINDOWS = [{"pattern": r"^0*(2[4-9]|[3-9][0-9]|1[0-5][0-9]|16[0-8])h$"},
                   {"pattern": r"^0*(14[4-9][0-9]|1[5-9][0-9]{2}|[2-9][0-9]{3}|100[0-7][0-9]|10080)m$"},
                   {"pattern": r"^0*(86[4-9][0-9]{2}|8[7-9][0-9]{3}|9[0-9]{4}|[1-5][0-9]{5}|60[0-3][0-9]{3}|"
                               r"604[0-7][0-9]{2}|604800)s$"}]
"""The windows a deployment on its defaults takes, 24 to 168 hours, as the document states them (in hours, minutes
or seconds); one that lowers the minimum takes shorter ones too."""


class BatchCreateRequest(BaseModel):
    # OpenAI refuses a parameter it does not know rather than ignore it (`unknown_parameter`); so do we.
    model_config = ConfigDict(extra="forbid")

    input_file_id: Annotated[str, Field(min_length=1), refused_as(
        "missing_required_parameter", "input_file_id must be the id of a file uploaded with purpose 'batch' (got "
                                      "{given}).")]
    """A file uploaded with purpose `batch`."""
    endpoint: Annotated[Endpoint, refused_as(
        "unsupported_endpoint", f"endpoint must be one of {', '.join(SUPPORTED_ENDPOINTS)} (got {{given}}).")]
    completion_window: Annotated[str, Field(pattern=r"^[0-9]{1,9}[hms]$", examples=["24h"],
                                            json_schema_extra={"anyOf": DEFAULT_WINDOWS}), refused_as(
        "invalid_completion_window", "completion_window must be a number of hours such as '24h' (got {given}).")]
    """`24h` up to `168h` (`m` and `s` units exist for deployments that lower the minimum, in tests of expiry)."""
    metadata: Annotated[dict[MetadataKey, MetadataValue] | None, Field(max_length=MAX_METADATA_PAIRS), refused_as(
        "invalid_metadata", f"metadata must be an object of at most {MAX_METADATA_PAIRS} string pairs (keys up to 64 "
        "characters, values up to 512).")] = None
    """At most 16 pairs; keys up to 64 characters, values up to 512."""
    output_expires_after: Annotated[ExpiresAfter | None, refused_as(
        "invalid_output_expires_after", f"output_expires_after must be {{'anchor': 'created_at', 'seconds': N}} with "
        f"N between {MIN_EXPIRES_AFTER_S} and {MAX_EXPIRES_AFTER_S}.")] = None
    """When the output and error files expire; omitted: 30 days (`RESULT_FILE_EXPIRES_AFTER_S`)."""
    allow_partial: Annotated[bool, Strict(), refused_as("invalid_allow_partial", "allow_partial must be true or false.")
                             ] = False
    """Extension: run the valid lines; refused lines go to the error file."""
    hold: Annotated[bool, Strict(), refused_as("invalid_hold", "hold must be true or false.")] = False
    """Extension: validate only; the batch runs after `POST /v1/batches/{id}/release`."""
    placement: Annotated[Placement, refused_as(
        "invalid_placement", "placement must be 'approved_providers' or 'own_organization' (got {given}).")
    ] = "approved_providers"
    """Extension: `own_organization` runs the batch only on providers of the caller's organisation."""
