"""Reads the repository's test vectors (tests/vectors/*.json)."""

import ipaddress
import json
import os
import re
from typing import Any, Dict, List, Tuple

VECTORS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "tests", "vectors")
_MEANING = re.compile(r"^(u8|u32|u64|i64|bool|utf8|ipv4|ipv6|bytes) (.+?) = (.*)$")


def load(name: str) -> Any:
    with open(os.path.join(VECTORS_DIR, name), encoding="utf-8") as f:
        return json.load(f)


def protocol_vectors() -> List[Dict[str, Any]]:
    vectors: List[Dict[str, Any]] = load("protocol.json")["vectors"]
    return vectors


def fields(vector: Dict[str, Any]) -> List[Tuple[str, str, Any]]:
    """Each field's (type, name, value), values parsed by type."""
    out = []
    for field in vector["fields"]:
        match = _MEANING.match(field["meaning"])
        if match is None:
            raise ValueError("unreadable meaning {!r}".format(field["meaning"]))
        kind, name, rest = match.groups()
        value: Any
        if kind == "utf8":
            value, _ = json.JSONDecoder().raw_decode(rest)
        else:
            token = rest.split(" ")[0]
            if kind in ("u8", "u32", "u64", "i64"):
                value = int(token)
            elif kind == "bool":
                value = token == "true"
            elif kind in ("ipv4", "ipv6"):
                value = ipaddress.ip_address(token)
            else:
                value = bytes.fromhex(token)
        out.append((kind, name, value))
    return out


def named(vector: Dict[str, Any]) -> Dict[str, Any]:
    """Field name -> value; an Option whose tag says None maps to None."""
    values: Dict[str, Any] = {}
    for kind, name, value in fields(vector):
        if name.endswith(" tag"):
            base = name[: -len(" tag")]
            if value == 0:
                values[base] = None
        elif name.endswith(" length") or name.endswith(" IpAddr variant"):
            continue
        else:
            values[name] = value
    return values
