"""A decoder without hand-written C (ptars, Arrow compute, orjson), measured against the
collector's (benchmarks/decode_ab.py); see decode.py."""
