"""Small helpers shared by the harness: the bad-input error (exit 2, naming the field as fsdpsim's
InputError does), atomic JSON output and field-checked JSON reading."""
import json
import os
import tempfile

EXIT_BAD_INPUT = 2


class InputError(Exception):
    """Bad input: `field` is the dotted path ("plan.seq_len", "matrix.cases[3].world"), `value` the
    offending value as written, `allowed` what would have been accepted. The message has the shape of
    fsdpsim's common/errors.h InputError so both tools read alike."""

    def __init__(self, field, value, allowed):
        self.field, self.value, self.allowed = field, value, allowed
        super().__init__(f"{field} = {value}: {allowed}")


def show(value):
    """A value as it is quoted in messages (JSON, cut when long)."""
    text = json.dumps(value, sort_keys=True) if not isinstance(value, str) else json.dumps(value)
    return text if len(text) <= 80 else text[:77] + "..."


def load_json(path, field):
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except FileNotFoundError:
        raise InputError(field, show(str(path)), "file not found") from None
    except json.JSONDecodeError as e:
        raise InputError(field, show(str(path)), f"not valid JSON ({e.msg} at line {e.lineno})") from None


def write_json_atomic(path, obj):
    """Writes JSON to a temporary file beside `path` and renames it (no half-written fixture is ever
    seen, the same promise as fsdpsim's common/output_file.h)."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=os.path.basename(path) + ".", suffix=".tmp.json", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(obj, f, indent=1, sort_keys=False)
            f.write("\n")
        os.chmod(tmp, 0o644)   # mkstemp makes 0600; fixtures are ordinary committed files
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def require(obj, key, kind, field):
    """obj[key] with its type checked; InputError naming `field.key` otherwise."""
    name = f"{field}.{key}" if field else key
    if not isinstance(obj, dict) or key not in obj:
        raise InputError(name, "<missing>", f"required ({kind_name(kind)})")
    value = obj[key]
    if not is_kind(value, kind):
        raise InputError(name, show(value), f"expected {kind_name(kind)}")
    return value


def is_kind(value, kind):
    if kind is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if kind is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    return isinstance(value, kind)


def kind_name(kind):
    return {int: "an integer", float: "a number", str: "a string", bool: "true or false", dict: "an object",
            list: "an array"}.get(kind, str(kind))
