"""New file and batch ids sort in the order they were made (lists order by `created_at`, in seconds, then by id), and
keep OpenAI's shape: a prefix and 24 lower-case hex digits."""

import re

from contracts.ids import new_batch_id, new_file_id


def test_ids_made_one_after_another_sort_in_that_order_even_within_a_millisecond() -> None:
    for new, prefix in ((new_batch_id, "batch_"), (new_file_id, "file-")):
        made = [new() for _ in range(2000)]
        assert made == sorted(made) and len(set(made)) == len(made)
        assert all(re.fullmatch(rf"{prefix}[0-9a-f]{{24}}", ident) for ident in made)
