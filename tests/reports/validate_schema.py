#!/usr/bin/env python3
"""Validate JSON documents against one of fsdpsim's JSON Schemas (reports/schema/*.schema.json).

usage: validate_schema.py SCHEMA DOC [DOC...]
exit 0: every DOC is valid; 1: at least one is invalid (each error printed with its JSON path);
2: a file could not be read or parsed; 3: python3-jsonschema is not installed.
Works with Debian 12's python3-jsonschema (4.10) and newer releases (Draft 2020-12 validator).
"""
import json
import sys

try:
    import jsonschema
except ImportError:
    print("validate_schema.py: python3-jsonschema is not installed (apt-get install -y python3-jsonschema)", file=sys.stderr)
    sys.exit(3)


def load(path):
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        print(f"{path}: cannot read JSON: {e}", file=sys.stderr)
        sys.exit(2)


def main(argv):
    if len(argv) < 3:
        print(__doc__, file=sys.stderr)
        return 2
    schema = load(argv[1])
    cls = jsonschema.Draft202012Validator
    cls.check_schema(schema)  # the schema itself must be a valid 2020-12 schema
    validator = cls(schema)
    bad = 0
    for path in argv[2:]:
        errors = sorted(validator.iter_errors(load(path)), key=lambda e: list(e.absolute_path))
        for e in errors[:20]:
            where = "/".join(str(p) for p in e.absolute_path) or "<root>"
            print(f"{path}: {where}: {e.message[:300]}")
        if errors:
            bad += 1
        else:
            print(f"{path}: valid")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
