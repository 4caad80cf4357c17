#!/usr/bin/env python3
"""The Hugging Face `tokenizers` peer of `hlat bench ingest`.

Reads the same documents `hlat data ingest` reads (JSONL, plain or compressed by gzip or zstd,
Parquet through pyarrow, plain text files; the text at --text-field, a dotted path for nested
fields), in batches of --batch documents, encodes each batch with `Tokenizer.encode_batch`
(without special tokens, on all cores: the library's own parallelism), and counts the tokens plus
one EOS per document, as ingest writes them. Prints one JSON line: documents, tokens, text_bytes,
peak_rss_bytes, version. Exit status 3 when `tokenizers` is not installed.
"""

import argparse
import gzip
import io
import json
import os
import resource
import sys

MISSING = 3


def documents(path, field):
    """The texts of one file, in order, empty ones left out."""
    with open(path, "rb") as f:
        magic = f.read(4)
    parts = field.split(".")

    def lookup(row):
        for part in parts:
            if not isinstance(row, dict) or part not in row:
                return None
            row = row[part]
        return row

    if magic == b"PAR1":
        import pyarrow.parquet as pq

        parquet = pq.ParquetFile(path)
        for group in range(parquet.num_row_groups):
            table = parquet.read_row_group(group, columns=[parts[0]])
            for row in table.to_pylist():
                text = lookup(row)
                if text:
                    yield text
        return
    if magic[:2] == b"\x1f\x8b":
        stream = gzip.open(path, "rb")
    elif magic == b"\x28\xb5\x2f\xfd":
        import zstandard

        stream = zstandard.ZstdDecompressor().stream_reader(open(path, "rb"))
    else:
        stream = open(path, "rb")
    name = os.path.basename(path).lower()
    for suffix in (".gz", ".gzip", ".zst", ".zstd"):
        if name.endswith(suffix):
            name = name[: -len(suffix)]
    if name.endswith((".jsonl", ".ndjson", ".json")):
        for line in io.BufferedReader(stream, 1 << 20):
            if line.strip():
                text = lookup(json.loads(line))
                if text:
                    yield text
    else:
        text = stream.read().decode("utf-8")
        if text:
            yield text


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokenizer", required=True)
    parser.add_argument("--input", nargs="+", required=True)
    parser.add_argument("--text-field", default="text")
    parser.add_argument("--batch", type=int, default=1000)
    args = parser.parse_args()
    try:
        import tokenizers
    except ImportError:
        print("the Python package `tokenizers` is not installed", file=sys.stderr)
        sys.exit(MISSING)
    tokenizer = tokenizers.Tokenizer.from_file(args.tokenizer)
    count = {"documents": 0, "tokens": 0, "text_bytes": 0}

    def encode(batch):
        for encoding in tokenizer.encode_batch(batch, add_special_tokens=False):
            count["tokens"] += len(encoding.ids) + 1
        count["documents"] += len(batch)

    batch = []
    for path in args.input:
        for text in documents(path, args.text_field):
            count["text_bytes"] += len(text.encode("utf-8"))
            batch.append(text)
            if len(batch) == args.batch:
                encode(batch)
                batch = []
    if batch:
        encode(batch)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(json.dumps({**count, "peak_rss_bytes": peak, "version": f"tokenizers {tokenizers.__version__}"}))


if __name__ == "__main__":
    main()
