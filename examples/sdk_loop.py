import json
import time

from openai import OpenAI

client = OpenAI()  # reads OPENAI_BASE_URL and OPENAI_API_KEY, exported above

with open("requests.jsonl", "w") as f:
    for i, question in enumerate(["Say hello.", "Name a colour.", "Count to three."]):
        body = {"model": "smollm2", "messages": [{"role": "user", "content": question}], "max_tokens": 32}
        f.write(json.dumps({"custom_id": f"q-{i}", "method": "POST", "url": "/v1/chat/completions",
                            "body": body}) + "\n")

batch_file = client.files.create(file=open("requests.jsonl", "rb"), purpose="batch")
batch = client.batches.create(input_file_id=batch_file.id, endpoint="/v1/chat/completions",
                              completion_window="24h", metadata={"project": "demo"})
while batch.status not in ("completed", "failed", "expired", "cancelled"):
    time.sleep(1)
    batch = client.batches.retrieve(batch.id)
    print(batch.status, batch.request_counts)

if batch.output_file_id:
    print(client.files.content(batch.output_file_id).text)
if batch.errors:
    for error in batch.errors.data or []:
        print(error.line, error.code, error.param, error.message)
