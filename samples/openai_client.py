"""Talk to `edgekit serve` with the official openai client.

edgekit serve my.bundle --api-key secret &
EDGEKIT_URL=http://127.0.0.1:8000/v1 EDGEKIT_API_KEY=secret python samples/openai_client.py
"""

from __future__ import annotations

import os

from openai import OpenAI


def main() -> None:
    client = OpenAI(
        base_url=os.environ.get("EDGEKIT_URL", "http://127.0.0.1:8000/v1"),
        api_key=os.environ.get("EDGEKIT_API_KEY", "none"),
    )
    model = client.models.list().data[0].id
    print(f"model: {model}")
    stream = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "Name three colours."}],
        max_tokens=48,
        temperature=0,
        stream=True,
    )
    for chunk in stream:
        print(chunk.choices[0].delta.content or "", end="", flush=True)
    print()


if __name__ == "__main__":
    main()
