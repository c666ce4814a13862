"""The `selects` helper that cargo-bazel's generated BUILD files load."""

def _with_or(input_dict, no_match_error = ""):
    """Like bazel_skylib's selects.with_or: a key may be a tuple of conditions."""
    output = {}
    for key, value in input_dict.items():
        if type(key) == type(()):
            for condition in key:
                if condition in output:
                    fail("selects.with_or: %s appears twice" % condition)
                output[condition] = value
        else:
            if key in output:
                fail("selects.with_or: %s appears twice" % key)
            output[key] = value
    return select(output, no_match_error = no_match_error)

def _with_or_dict(input_dict):
    output = {}
    for key, value in input_dict.items():
        if type(key) == type(()):
            for condition in key:
                output[condition] = value
        else:
            output[key] = value
    return output

selects = struct(with_or = _with_or, with_or_dict = _with_or_dict)
