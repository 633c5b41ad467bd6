"""Template filters that turn a value into a literal of the language it is embedded in.

Every string a template prints goes through one of them: `render` rejects a plain string (see
`require_escaped`), so a description holding `\"\"\"`, a quote in a path or non-ASCII text can never
end a literal early or break the generated file.
"""

from __future__ import annotations

import re
from typing import Any

from markupsafe import Markup

_PLAIN = re.compile(r"[A-Za-z0-9_ ,.:+\-\[\]/=()]*")


def py(value: str) -> Markup:
    """A Python string literal."""
    return Markup(repr(str(value)))


def cpp(value: str) -> Markup:
    """A C++ narrow string literal holding the UTF-8 bytes of `value`; octal escapes (at most three
    digits) never swallow the characters that follow, as hex escapes would."""
    out = []
    for byte in str(value).encode("utf-8"):
        char = chr(byte)
        if char in '"\\?':
            out.append("\\" + char)
        elif 0x20 <= byte < 0x7F:
            out.append(char)
        else:
            out.append(f"\\{byte:03o}")
    return Markup('"' + "".join(out) + '"')


def meson(value: str) -> Markup:
    """A Meson string literal."""
    text = str(value).replace("\\", "\\\\").replace("'", "\\'")
    text = "".join(c if c >= " " or c == "\t" else f"\\x{ord(c):02x}" for c in text)
    return Markup(f"'{text}'")


def cmake(value: str) -> Markup:
    """A CMake quoted argument: no variable reference or escape sequence inside is evaluated."""
    text = "".join("\\" + c if c in '\\"$' else "\\n" if c == "\n" else c for c in str(value))
    return Markup(f'"{text}"')


def pkgconfig(value: str) -> Markup:
    """A word of a pkg-config file's Cflags or Libs: spaces and shell characters escaped, `$` doubled."""
    text = str(value).replace("$", "$$")
    return Markup("".join("\\" + c if c in " \t\\\"'#" else c for c in text))


def toml(value: str) -> Markup:
    """A TOML basic string (non-ASCII text stays as it is: TOML files are UTF-8)."""
    escapes = {'"': '\\"', "\\": "\\\\", "\n": "\\n", "\t": "\\t", "\r": "\\r"}
    text = "".join(escapes.get(c, c if c >= " " and c != "\x7f" else f"\\u{ord(c):04x}") for c in str(value))
    return Markup(f'"{text}"')


def yaml(value: str | list[str]) -> Markup:
    """A YAML double-quoted scalar, or a flow sequence of them for a list. Escaped: quotes, backslashes and every
    character
    YAML does not allow as it is or reads as a line break (control characters, DEL, NEL, U+2028/9, a BOM)."""
    if isinstance(value, (list, tuple)):
        return Markup("[" + ", ".join(yaml(item) for item in value) + "]")
    return Markup('"' + "".join(_yaml_char(c) for c in str(value)) + '"')


def _yaml_char(c: str) -> str:
    code = ord(c)
    if 0xD800 <= code < 0xE000:  # a byte that was not UTF-8, kept by Python as a lone surrogate: no YAML text holds it
        raise ValueError(f"not text: {c!r}")
    if c in '"\\':
        return "\\" + c
    if 0x20 <= code < 0x7F or (code >= 0xA0 and code not in (0x2028, 0x2029, 0xFEFF, 0xFFFE, 0xFFFF)):
        return c
    return f"\\u{code:04x}"


def ident(value: str) -> Markup:
    """An identifier (Python and C++), printed as it is; anything else is a bug upstream."""
    if not (str(value).isidentifier() and str(value).isascii()):
        raise ValueError(f"not an identifier: {value!r}")
    return Markup(value)


def plain(value: str) -> Markup:
    """Text made by shimgen itself (type signatures, target ids) that is safe inside any quoted
    literal or format string: no quotes, backslashes, percent signs or line breaks."""
    if not _PLAIN.fullmatch(str(value)):
        raise ValueError(f"not plain text: {value!r}")
    return Markup(value)


def comment(value: str) -> Markup:
    """Text for a line comment: control characters, line breaks among them, become spaces."""
    return Markup("".join(c if c >= " " and c != "\x7f" else " " for c in str(value)))


FILTERS = {
    "py": py,
    "cpp": cpp,
    "meson": meson,
    "toml": toml,
    "cmake": cmake,
    "pkgconfig": pkgconfig,
    "yaml": yaml,
    "ident": ident,
    "plain": plain,
    "comment": comment,
}


def require_escaped(value: Any) -> Any:
    """Jinja `finalize`: a string reaching the output unescaped is a template bug."""
    if isinstance(value, str) and not isinstance(value, Markup):
        raise TypeError(f"template prints the string {value!r} without an escaping filter ({', '.join(FILTERS)})")
    return value
