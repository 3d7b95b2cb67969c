#!/usr/bin/env python3
"""Write tests/st_corpus/: safetensors files for tests/test_safetensors.c and seeds for the fuzzer.

Only the standard library (struct, json): the files come from a writer independent of the C one,
so the C reader and writer are checked against the format itself.

    ok_*.safetensors      valid files; the C loader must read them (ok_basic is also what the C
                          writer must produce byte for byte from the same tensors)
    fmt_*.safetensors     malformed files; loading each must fail with TFM_E_FORMAT

The test keeps a table of every file with the expected code and a piece of the expected message,
so a file added here needs a row there. Deterministic: running it twice writes the same bytes.

    python3 tools/gen_st_corpus.py [outdir]      (default: tests/st_corpus next to this script)
"""
import json
import os
import struct
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = sys.argv[1] if len(sys.argv) > 1 else os.path.join(HERE, "..", "tests", "st_corpus")


def floats(n, scale=0.25, shift=-1.0):
    """n deterministic float32 values (exactly representable): i * scale + shift."""
    return [i * scale + shift for i in range(n)]


def f32_bytes(vals):
    return struct.pack("<%df" % len(vals), *vals)


def numel(shape):
    n = 1
    for d in shape:
        n *= d
    return n


def header_bytes(obj, pad=True, **dump_args):
    """JSON text of obj, UTF-8, padded with spaces to a multiple of 8 (as the format recommends)."""
    args = {"separators": (",", ":"), "ensure_ascii": False}
    args.update(dump_args)
    h = json.dumps(obj, **args).encode("utf-8")
    if pad:
        h += b" " * (-len(h) % 8)
    return h


def file_bytes(hdr, data):
    return struct.pack("<Q", len(hdr)) + hdr + data


def build(tensors, meta=None, **dump_args):
    """tensors: list of (name, shape, values) in data order. Returns the whole file's bytes."""
    obj = {}
    if meta is not None:
        obj["__metadata__"] = meta
    data = b""
    for name, shape, vals in tensors:
        b = f32_bytes(vals)
        obj[name] = {"dtype": "F32", "shape": shape, "data_offsets": [len(data), len(data) + len(b)]}
        data += b
    return file_bytes(header_bytes(obj, **dump_args), data)


def raw(header_text, data=b"", pad=True):
    """A file from literal header text (str or bytes): for malformed JSON."""
    h = header_text.encode("utf-8") if isinstance(header_text, str) else header_text
    if pad:
        h += b" " * (-len(h) % 8)
    return file_bytes(h, data)


def entry(shape, begin, end, dtype="F32"):
    return '{"dtype":"%s","shape":%s,"data_offsets":[%d,%d]}' % (
        dtype, json.dumps(shape, separators=(",", ":")), begin, end)


FILES = {}


def add(name, content):
    assert name not in FILES, name
    FILES[name] = content


# ---- valid files -------------------------------------------------------------------------------

# ok_basic: tests/test_safetensors.c saves the same tensors and metadata with the C writer and wants
# these exact bytes.
BASIC = [
    ("a", [2, 3], floats(6)),
    ("b.weight", [4], floats(4, 0.5, 3.0)),
    ("c", [1, 2, 1, 2], floats(4, -0.125, 0.0)),
]
BASIC_META = {"format": "pt", "note": "quote \" backslash \\ newline \n tab \t ctl \x01 end"}
add("ok_basic", build(BASIC, BASIC_META))

# ok_unicode: non-ASCII names as \u escapes (one needs a surrogate pair), indented JSON, keys in
# another order, JSON order unlike data order, escapes in metadata.
uni_data = f32_bytes(floats(3)) + f32_bytes(floats(2, 1.0, 10.0))
uni_obj = {
    "__metadata__": {"k\u00e9y": "v/\u00e9\U0001F600A"},
    "\u00e9t\u00e9.\U0001F600": {"data_offsets": [12, 20], "shape": [2], "dtype": "F32"},
    "plain": {"shape": [3], "dtype": "F32", "data_offsets": [0, 12]},
}
add("ok_unicode", file_bytes(header_bytes(uni_obj, indent=2, ensure_ascii=True), uni_data))

# ok_empty: no tensors, no data
add("ok_empty", raw("{}"))
# ok_meta_only: metadata and no tensors
add("ok_meta_only", build([], {"name": "empty model"}))
# ok_zero_size: a (0,3) tensor (no bytes) and a scalar (shape [], one float); unpadded header
add("ok_zero_size", file_bytes(
    ('{"z":%s,"s":%s}' % (entry([0, 3], 0, 0), entry([], 0, 4))).encode(), f32_bytes([7.5])))
# ok_unknown_key: members other than dtype/shape/data_offsets are checked as JSON and ignored
add("ok_unknown_key", raw(
    '{"t":{"dtype":"F32","extra":[1,{"x":null,"y":true,"z":-1.5e3,"w":false},"\\u0000"],'
    '"shape":[2],"data_offsets":[0,8]}}', f32_bytes([1.0, 2.0])))

# ---- truncated files ---------------------------------------------------------------------------

small = build([("w", [2, 2], floats(4))], {"a": "b"})
hlen = struct.unpack("<Q", small[:8])[0]
add("fmt_trunc_len_0", b"")
add("fmt_trunc_len_3", small[:3])
add("fmt_trunc_len_7", small[:7])
add("fmt_trunc_header_0", small[:8])
add("fmt_trunc_header_1", small[:9])
add("fmt_trunc_header_half", small[:8 + hlen // 2])
add("fmt_trunc_header_last", small[:8 + hlen - 1])
add("fmt_trunc_data_0", small[:8 + hlen])
add("fmt_trunc_data_half", small[:8 + hlen + 8])
add("fmt_trunc_data_last", small[:-1])

# ---- header length -----------------------------------------------------------------------------

add("fmt_hlen_huge", struct.pack("<Q", 2**64 - 1) + b"{}      ")
add("fmt_hlen_over_limit", struct.pack("<Q", 100 * 1024 * 1024 + 1) + b"{}      ")
add("fmt_hlen_past_eof", struct.pack("<Q", 9) + b"{}      ")
add("fmt_hlen_zero", struct.pack("<Q", 0))
add("fmt_hlen_zero_with_data", struct.pack("<Q", 0) + b"{}")

# ---- JSON syntax -------------------------------------------------------------------------------

E = entry([2], 0, 8)
D8 = f32_bytes([1.0, 2.0])
add("fmt_json_trailing_garbage", raw('{"t":%s} x' % E, D8))
add("fmt_json_trailing_comma", raw('{"t":%s,}' % E, D8))
add("fmt_json_trailing_comma_array", raw('{"t":{"dtype":"F32","shape":[2,],"data_offsets":[0,8]}}', D8))
add("fmt_json_two_roots", raw('{}{}'))
add("fmt_json_unterminated_string", raw('{"t'))
add("fmt_json_unterminated_object", raw('{"t":%s' % E, D8))
add("fmt_json_missing_colon", raw('{"t" %s}' % E, D8))
add("fmt_json_missing_value", raw('{"t":}'))
add("fmt_json_single_quotes", raw("{'t':%s}" % E, D8))
add("fmt_json_unquoted_key", raw('{t:%s}' % E, D8))
add("fmt_json_comment", raw('{/* c */"t":%s}' % E, D8))
add("fmt_json_bad_escape", raw('{"t\\x":%s}' % E, D8))
add("fmt_json_bad_unicode_escape", raw('{"t\\u12G4":%s}' % E, D8))
add("fmt_json_short_unicode_escape", raw('{"t\\u12":%s}' % E, D8))
add("fmt_json_lone_high_surrogate", raw('{"t\\ud800":%s}' % E, D8))
add("fmt_json_lone_low_surrogate", raw('{"t\\udc00":%s}' % E, D8))
add("fmt_json_high_then_bmp", raw('{"t\\ud800\\u0041":%s}' % E, D8))
add("fmt_json_control_char", raw('{"t\n":%s}' % E, D8))
add("fmt_json_tab_in_string", raw('{"t\t":%s}' % E, D8))
add("fmt_json_nul_in_name", raw('{"t\\u0000x":%s}' % E, D8))
add("fmt_json_nul_in_meta", raw('{"__metadata__":{"k":"v\\u0000"}}'))
add("fmt_json_invalid_utf8", raw(b'{"t\xff":' + E.encode() + b'}', D8))
add("fmt_json_overlong_utf8", raw(b'{"t\xc0\x80":' + E.encode() + b'}', D8))
add("fmt_json_surrogate_utf8", raw(b'{"t\xed\xa0\x80":' + E.encode() + b'}', D8))
add("fmt_json_truncated_utf8", raw(b'{"t\xe2\x82":' + E.encode() + b'}', D8))
add("fmt_json_above_max_utf8", raw(b'{"t\xf4\x90\x80\x80":' + E.encode() + b'}', D8))
add("fmt_json_bom", raw(b'\xef\xbb\xbf{}'))
add("fmt_json_root_array", raw('[]'))
add("fmt_json_root_string", raw('"t"'))
add("fmt_json_root_number", raw('1'))
add("fmt_json_root_null", raw('null'))
add("fmt_json_only_spaces", raw('        ', pad=False))
add("fmt_json_bad_literal", raw('{"t":{"dtype":"F32","shape":[2],"data_offsets":[0,8],"x":tru}}', D8))
add("fmt_json_nan", raw('{"t":{"dtype":"F32","shape":[2],"data_offsets":[0,8],"x":NaN}}', D8))
add("fmt_json_leading_zero", raw('{"t":{"dtype":"F32","shape":[02],"data_offsets":[0,8]}}', D8))
add("fmt_json_bad_fraction", raw('{"t":{"dtype":"F32","shape":[2],"data_offsets":[0,8],"x":1.}}', D8))
add("fmt_json_bad_exponent", raw('{"t":{"dtype":"F32","shape":[2],"data_offsets":[0,8],"x":1e+}}', D8))
add("fmt_json_lone_minus", raw('{"t":{"dtype":"F32","shape":[2],"data_offsets":[0,8],"x":-}}', D8))
deep = "[" * 40 + "]" * 40
add("fmt_json_deep_arrays", raw('{"t":{"dtype":"F32","shape":[2],"data_offsets":[0,8],"x":%s}}' % deep, D8))
deep_obj = '{"a":' * 30 + "1" + "}" * 30
add("fmt_json_deep_objects", raw('{"t":{"dtype":"F32","shape":[2],"data_offsets":[0,8],"x":%s}}' % deep_obj, D8))
# 16 levels (the limit) is fine: root(1) > tensor(2) > 14 nested arrays (3..16)
add("ok_depth_limit", raw('{"t":{"dtype":"F32","shape":[2],"data_offsets":[0,8],"x":%s}}'
                          % ("[" * 14 + "]" * 14), D8))
add("fmt_json_depth_limit_plus_one", raw('{"t":{"dtype":"F32","shape":[2],"data_offsets":[0,8],"x":%s}}'
                                         % ("[" * 15 + "]" * 15), D8))

# ---- schema ------------------------------------------------------------------------------------

add("fmt_dtype_f16", raw('{"t":%s}' % entry([2], 0, 4, "F16"), D8[:4]))
add("fmt_dtype_bf16", raw('{"t":%s}' % entry([2], 0, 4, "BF16"), D8[:4]))
add("fmt_dtype_f64", raw('{"t":%s}' % entry([1], 0, 8, "F64"), D8))
add("fmt_dtype_i64", raw('{"t":%s}' % entry([1], 0, 8, "I64"), D8))
add("fmt_dtype_lowercase", raw('{"t":%s}' % entry([2], 0, 8, "f32"), D8))
add("fmt_dtype_not_string", raw('{"t":{"dtype":32,"shape":[2],"data_offsets":[0,8]}}', D8))
add("fmt_dtype_missing", raw('{"t":{"shape":[2],"data_offsets":[0,8]}}', D8))
add("fmt_dtype_twice", raw('{"t":{"dtype":"F32","dtype":"F32","shape":[2],"data_offsets":[0,8]}}', D8))
add("fmt_shape_missing", raw('{"t":{"dtype":"F32","data_offsets":[0,8]}}', D8))
add("fmt_shape_not_array", raw('{"t":{"dtype":"F32","shape":2,"data_offsets":[0,8]}}', D8))
add("fmt_shape_5d", raw('{"t":%s}' % entry([1, 1, 1, 1, 2], 0, 8), D8))
add("fmt_shape_negative", raw('{"t":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}}', D8))
add("fmt_shape_float", raw('{"t":{"dtype":"F32","shape":[2.0],"data_offsets":[0,8]}}', D8))
add("fmt_shape_exponent", raw('{"t":{"dtype":"F32","shape":[2e0],"data_offsets":[0,8]}}', D8))
add("fmt_shape_string", raw('{"t":{"dtype":"F32","shape":["2"],"data_offsets":[0,8]}}', D8))
add("fmt_shape_dim_over_u64", raw('{"t":{"dtype":"F32","shape":[18446744073709551616],"data_offsets":[0,8]}}', D8))
add("fmt_shape_dim_over_i64", raw('{"t":{"dtype":"F32","shape":[9223372036854775808],"data_offsets":[0,8]}}', D8))
add("fmt_shape_product_overflow", raw('{"t":%s}' % entry([2**32, 2**32, 2**32], 0, 8), D8))
add("fmt_shape_bytes_overflow", raw('{"t":%s}' % entry([2**62], 0, 8), D8))
add("fmt_shape_huge_wrapping", raw('{"t":%s}' % entry([2**32, 2**30], 0, 0)))
add("fmt_offsets_missing", raw('{"t":{"dtype":"F32","shape":[2]}}', D8))
add("fmt_offsets_one", raw('{"t":{"dtype":"F32","shape":[2],"data_offsets":[8]}}', D8))
add("fmt_offsets_three", raw('{"t":{"dtype":"F32","shape":[2],"data_offsets":[0,8,8]}}', D8))
add("fmt_offsets_reversed", raw('{"t":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}}', D8))
add("fmt_offsets_negative", raw('{"t":{"dtype":"F32","shape":[2],"data_offsets":[-8,0]}}', D8))
add("fmt_offsets_huge", raw('{"t":{"dtype":"F32","shape":[2],"data_offsets":[18446744073709551608,18446744073709551615]}}', D8))
add("fmt_offsets_size_mismatch", raw('{"x":%s}' % entry([5, 6], 0, 100), b"\0" * 100))
add("fmt_offsets_out_of_bounds", raw('{"t":%s}' % entry([2], 8, 16), D8))
add("fmt_offsets_overlap", raw('{"a":%s,"b":%s}' % (entry([2], 0, 8), entry([2], 4, 12)), D8 + D8[:4]))
add("fmt_offsets_same_range", raw('{"a":%s,"b":%s}' % (entry([2], 0, 8), entry([2], 0, 8)), D8))
add("fmt_offsets_hole", raw('{"a":%s,"b":%s}' % (entry([1], 0, 4), entry([1], 8, 12)), D8 + D8[:4]))
add("fmt_offsets_hole_at_start", raw('{"a":%s}' % entry([1], 4, 8), D8))
add("fmt_offsets_hole_at_end", raw('{"a":%s}' % entry([1], 0, 4), D8))
add("fmt_offsets_no_tensors_but_data", raw('{}', D8))
add("fmt_entry_not_object", raw('{"t":[2]}', D8))
add("fmt_entry_string", raw('{"t":"F32"}', D8))
add("fmt_duplicate_tensor", raw('{"t":%s,"t":%s}' % (entry([1], 0, 4), entry([1], 4, 8)), D8))
add("fmt_duplicate_tensor_escaped", raw('{"t":%s,"\\u0074":%s}' % (entry([1], 0, 4), entry([1], 4, 8)), D8))
add("fmt_meta_not_object", raw('{"__metadata__":["a"]}'))
add("fmt_meta_value_number", raw('{"__metadata__":{"a":1}}'))
add("fmt_meta_value_object", raw('{"__metadata__":{"a":{"b":"c"}}}'))
add("fmt_meta_twice", raw('{"__metadata__":{},"__metadata__":{}}'))
add("fmt_meta_duplicate_key", raw('{"__metadata__":{"a":"1","a":"2"}}'))


def main():
    os.makedirs(OUT, exist_ok=True)
    for name, content in sorted(FILES.items()):
        with open(os.path.join(OUT, name + ".safetensors"), "wb") as f:
            f.write(content)
    print("wrote %d files to %s" % (len(FILES), os.path.normpath(OUT)))


if __name__ == "__main__":
    main()
