#!/usr/bin/python3
"""Reads TensorBoard event files as TensorBoard does, independently of
trainctl's writer: TFRecord framing with its own CRC-32C check, the Event
messages decoded by Google's protobuf runtime from TensorBoard's schema
(tests/support/tensorboard/event.proto, compiled here with protoc).

    read_tfevents.py FILE_OR_DIR...   prints one JSON object per line:
    {"file_version": ...} or {"step": N, "wall_time": T, "scalars": {tag: value}}
Exits 1 with a message on a corrupt record.
"""
import glob
import importlib
import json
import os
import struct
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))


def crc32c(data):
    crc = 0xFFFFFFFF
    for b in data:
        crc ^= b
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def masked(data):
    c = crc32c(data)
    return (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def event_module():
    out = tempfile.mkdtemp(prefix="tfevents-pb-")
    subprocess.run(["protoc", "-I", os.path.join(HERE, "tensorboard"), "--python_out", out,
                    os.path.join(HERE, "tensorboard", "event.proto")], check=True)
    sys.path.insert(0, out)
    return importlib.import_module("event_pb2")


def records(path):
    with open(path, "rb") as f:
        data = f.read()
    pos = 0
    while pos < len(data):
        if len(data) - pos < 12:
            raise ValueError("%s: truncated header at byte %d" % (path, pos))
        header = data[pos:pos + 8]
        (length,) = struct.unpack("<Q", header)
        (hcrc,) = struct.unpack("<I", data[pos + 8:pos + 12])
        if hcrc != masked(header):
            raise ValueError("%s: bad length CRC at byte %d" % (path, pos))
        body = data[pos + 12:pos + 12 + length]
        (bcrc,) = struct.unpack("<I", data[pos + 12 + length:pos + 16 + length])
        if len(body) != length or bcrc != masked(body):
            raise ValueError("%s: bad data CRC at byte %d" % (path, pos))
        yield body
        pos += 16 + length


def main():
    pb = event_module()
    files = []
    for arg in sys.argv[1:]:
        files += sorted(glob.glob(os.path.join(arg, "events.out.tfevents.*"))) if os.path.isdir(arg) else [arg]
    if not files:
        print("no event files in %s" % " ".join(sys.argv[1:]), file=sys.stderr)
        return 1
    try:
        for path in files:
            for body in records(path):
                e = pb.Event()
                e.ParseFromString(body)
                if e.HasField("file_version"):
                    print(json.dumps({"file_version": e.file_version}))
                elif e.HasField("summary"):
                    print(json.dumps({"step": e.step, "wall_time": e.wall_time,
                                      "scalars": {v.tag: v.simple_value for v in e.summary.value}}))
    except ValueError as err:
        print(err, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
