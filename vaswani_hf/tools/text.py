"""Lines of text as aligned corpora count them: one per "\\n", as `wc -l` does.

`str.splitlines()` also breaks at U+2028, U+2029, U+0085, form feed and vertical tab, characters that real
corpora hold inside a sentence: the source and target files would no longer line up, and a translator would
write more output lines than it read.

Files are read as they are or compressed (`opened`); a write the disk refuses is told apart from other errors
(`refused_write`), so that the tools can say so in one line and keep what was written. Every text the tools read and
write is UTF-8, their standard output too (`utf8_output`), whatever the locale's encoding.
"""

import bz2
import codecs
import errno
import gzip
import lzma
import sys
import zlib
from pathlib import Path

DECOMPRESSED = {".gz": gzip.open, ".bz2": bz2.open, ".xz": lzma.open}
# What reading a compressed file raises where it is damaged or cut short (gzip's bad header: an OSError).
DAMAGED = (EOFError, lzma.LZMAError, zlib.error)


def split_lines(text: str) -> list[str]:
    """The lines of `text`, split at "\\n" only; a "\\r" before it goes too, and a final "\\n" ends the last line."""
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()
    return [line.removesuffix("\r") for line in lines]


def decode_utf8(data: bytes, name: str, first_line: int = 1) -> str:
    """`data` (whose first line is line `first_line` of `name`) as UTF-8 text, without the byte order mark some
    editors write at a file's start; otherwise a one-line ValueError naming `name`, the line and the byte."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        line = data.count(b"\n", 0, error.start) + first_line
        raise ValueError(f"{name} is not UTF-8 text: byte 0x{data[error.start]:02x} on line {line} "
                         f"(convert it, e.g. iconv -f latin1 -t utf-8)") from None
    return text.removeprefix("\ufeff") if first_line == 1 else text


def opened(path: str | Path):
    """`path` opened to read bytes, decompressed by its suffix (.gz, .bz2, .xz)."""
    return DECOMPRESSED.get(Path(path).suffix, open)(path, "rb")


def read_lines(path: str | Path) -> list[str]:
    """The lines of a UTF-8 file, as it is or compressed (`opened`), split as `split_lines` does; a compressed file
    that is damaged or cut short is a one-line ValueError (a missing one, the OSError)."""
    try:
        with opened(path) as file:
            data = file.read()
    except DAMAGED as error:
        raise ValueError(f"{path} cannot be read: {error or type(error).__name__}") from None
    return split_lines(decode_utf8(data, str(path)))


def utf8_output() -> None:
    """Standard output in UTF-8 where the locale names another encoding (a legacy locale's latin-1, a Windows code
    page when redirected to a file): translations, and the help's and the run's § and α, need not fit in one."""
    encoding = getattr(sys.stdout, "encoding", None)
    if encoding and codecs.lookup(encoding).name != "utf-8":
        sys.stdout.reconfigure(encoding="utf-8")


def refused_write(error: BaseException) -> bool:
    """A write refused for want of room (a full disk, a quota) or by a read-only file system; safetensors' error
    names the OS error's number in its message."""
    codes = (errno.ENOSPC, errno.EDQUOT, errno.EROFS)
    if isinstance(error, OSError):
        return error.errno in codes
    return type(error).__name__ == "SafetensorError" and any(f"(os error {code})" in str(error) for code in codes)
