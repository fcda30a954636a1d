"""A test-side TFRecord writer: framing, CRC32C and ``tf.train.Example`` encoding.

Written from the format's description, independently of the reader's kernels:
the CRC is the bitwise (table-free) CRC32C, the encoder builds the protobuf
wire format by hand. ``protobuf_example`` encodes the same message with the
``protobuf`` package, from ``example.proto``'s descriptors built here.
"""

from __future__ import annotations

import functools
import gzip
import struct
import zlib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

Value = Sequence[int] | Sequence[float] | Sequence[bytes] | None
# A feature: (kind, values), kind "int64", "float" or "bytes"; values None: a Feature with no list.
Feature = tuple[str, Value]


def crc32c_bitwise(data: bytes) -> int:
    """CRC32C one bit at a time (the definition, no table)."""
    crc = 0xFFFFFFFF
    for b in data:
        crc ^= b
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
    return crc ^ 0xFFFFFFFF


def masked(crc: int) -> int:
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def varint(v: int) -> bytes:
    v &= (1 << 64) - 1  # negative int64: two's complement, 10 bytes
    out = bytearray()
    while True:
        b = v & 0x7F
        v >>= 7
        if v:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def field_bytes(number: int, payload: bytes) -> bytes:
    return varint(number << 3 | 2) + varint(len(payload)) + payload


def encode_list(kind: str, values: Value, packed: bool = True) -> bytes:
    """Encode a BytesList / FloatList / Int64List (packed or one tag per value)."""
    if values is None:
        return b""
    if kind == "bytes":
        return b"".join(field_bytes(1, bytes(v)) for v in values)  # type: ignore[arg-type]
    if kind == "float":
        if packed:
            return field_bytes(1, b"".join(struct.pack("<f", v) for v in values))
        return b"".join(varint(1 << 3 | 5) + struct.pack("<f", v) for v in values)
    if packed:
        return field_bytes(1, b"".join(varint(int(v)) for v in values))
    return b"".join(varint(1 << 3 | 0) + varint(int(v)) for v in values)


_KIND_FIELD = {"bytes": 1, "float": 2, "int64": 3}


def encode_feature(kind: str, values: Value, packed: bool = True) -> bytes:
    if values is None:
        return b""  # a Feature with no list
    return field_bytes(_KIND_FIELD[kind], encode_list(kind, values, packed))


def encode_example(features: Mapping[str, Feature], packed: bool = True) -> bytes:
    """Encode a tf.train.Example from ``{name: (kind, values)}``."""
    entries = b"".join(
        field_bytes(1, field_bytes(1, name.encode()) + field_bytes(2, encode_feature(k, v, packed)))
        for name, (k, v) in features.items()
    )
    return field_bytes(1, entries)


def frame(data: bytes) -> bytes:
    """One TFRecord: length, masked CRC of the length, data, masked CRC of the data."""
    length = struct.pack("<Q", len(data))
    return (
        length
        + struct.pack("<I", masked(crc32c_bitwise(length)))
        + data
        + struct.pack("<I", masked(crc32c_bitwise(data)))
    )


def write_records(path: Path, records: Sequence[bytes], compression: str | None = None) -> Path:
    """Write framed records, optionally GZIP or ZLIB compressed as a whole."""
    raw = b"".join(frame(r) for r in records)
    if compression == "GZIP":
        raw = gzip.compress(raw)
    elif compression == "ZLIB":
        raw = zlib.compress(raw)
    path.write_bytes(raw)
    return path


def rows_to_examples(
    rows: Mapping[str, Sequence[Any]], kinds: Mapping[str, str], packed: bool = True
) -> list[bytes]:
    """Encode column-wise rows: None is an absent feature, a list several values."""
    names = list(rows)
    n = len(rows[names[0]])
    out = []
    for i in range(n):
        feats: dict[str, Feature] = {}
        for name in names:
            v = rows[name][i]
            if v is None:
                continue
            vals = list(v) if isinstance(v, (list, tuple)) else [v]
            if kinds[name] == "bytes":
                vals = [x.encode() if isinstance(x, str) else x for x in vals]
            feats[name] = (kinds[name], vals)
        out.append(encode_example(feats, packed))
    return out


@functools.lru_cache(maxsize=1)
def _example_classes() -> dict[str, Any]:
    """Build tf.train.Example's message classes from example.proto/feature.proto's fields."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    fdp = descriptor_pb2.FileDescriptorProto(name="tnrec_test_example.proto", package="tt")
    fdp.syntax = "proto3"
    F = descriptor_pb2.FieldDescriptorProto
    rep, opt = F.LABEL_REPEATED, F.LABEL_OPTIONAL

    def message(name: str, fields: list[tuple[str, int, int, int, str | None]]) -> Any:
        m = fdp.message_type.add(name=name)
        for fname, number, label, ftype, type_name in fields:
            f = m.field.add(name=fname, number=number, label=label, type=ftype)
            if type_name:
                f.type_name = type_name
        return m

    message("BytesList", [("value", 1, rep, F.TYPE_BYTES, None)])
    message("FloatList", [("value", 1, rep, F.TYPE_FLOAT, None)])
    message("Int64List", [("value", 1, rep, F.TYPE_INT64, None)])
    feat = message(
        "Feature",
        [
            ("bytes_list", 1, opt, F.TYPE_MESSAGE, ".tt.BytesList"),
            ("float_list", 2, opt, F.TYPE_MESSAGE, ".tt.FloatList"),
            ("int64_list", 3, opt, F.TYPE_MESSAGE, ".tt.Int64List"),
        ],
    )
    feat.oneof_decl.add(name="kind")
    for f in feat.field:
        f.oneof_index = 0
    feats = message("Features", [("feature", 1, rep, F.TYPE_MESSAGE, ".tt.Features.FeatureEntry")])
    entry = feats.nested_type.add(name="FeatureEntry")
    entry.options.map_entry = True
    entry.field.add(name="key", number=1, label=opt, type=F.TYPE_STRING)
    entry.field.add(name="value", number=2, label=opt, type=F.TYPE_MESSAGE, type_name=".tt.Feature")
    message("Example", [("features", 1, opt, F.TYPE_MESSAGE, ".tt.Features")])
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fdp)
    return {
        n: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"tt.{n}"))
        for n in ("Example",)
    }


def protobuf_example(features: Mapping[str, Feature]) -> bytes:
    """Encode the same Example with the protobuf package (packed lists, its own field order)."""
    example = _example_classes()["Example"]()
    for name, (kind, values) in features.items():
        feature = example.features.feature[name]
        if values is None:
            continue
        getattr(feature, f"{kind}_list").value.extend(values)
    return example.SerializeToString(deterministic=True)
