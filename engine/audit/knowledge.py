"""The knowledge table (presets/optimisations.json): known optimisations, where each applies, and
per framework and version whether it is supported, on by default, and the flag that turns it on.

Every entry and every support row carries a source (document address and the version it
describes). Each framework version also keeps the list of its documented CLI arguments
(``args``, read from its source at that tag), so a printed flag can be checked to exist.

Versions are matched by PEP 440 specifiers (``">=0.6.0,<0.8.0"``). A version the table does not
know resolves to the nearest known one at or below it (else the oldest), with a warning.
llama.cpp's build numbers ("b4589" or "4589") are versions too.
"""
from __future__ import annotations

import functools
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

ROOT = Path(__file__).resolve().parents[2]
PRESET = ROOT / "presets" / "optimisations.json"


@dataclass(frozen=True)
class SourceRef:
    url: str
    version: str = ""

    @classmethod
    def parse(cls, d: Any, where: str) -> SourceRef:
        """A document address, or (for this project's own entries) a file of this repository."""
        url = str(d.get("url", "")) if isinstance(d, dict) else ""
        if not (url.startswith(("https://", "http://")) or (url and (ROOT / url).is_file())):
            raise ValueError(f"{where}: a source needs a url (or a file of this repository), got {d!r}")
        return cls(url, str(d.get("version") or ""))


@dataclass(frozen=True)
class Support:
    """One framework's answer for one optimisation over a range of its versions."""

    versions: str  # PEP 440 specifier ("" = every version)
    supported: bool
    default_on: bool
    flag: str | None  # the CLI flag (or config key) that turns it on
    off_flag: str | None
    note: str
    source: SourceRef
    value: str | None = None  # the flag's value that turns it on ("--quantization" "awq")
    off_value: str | None = None
    unsupported_on: tuple[str, ...] = ()  # hardware archs this version cannot run it on
    unsupported_why: str = ""

    @property
    def how_on(self) -> str:
        """The exact flag (and value) that turns it on; "" when none is known."""
        return f"{self.flag} {self.value}" if self.flag and self.value else (self.flag or "")

    @property
    def how_off(self) -> str:
        return f"{self.off_flag} {self.off_value}" if self.off_flag and self.off_value else (self.off_flag or "")

    def covers(self, version: Version) -> bool:
        return version in SpecifierSet(self.versions) if self.versions else True


@dataclass(frozen=True)
class Optimisation:
    name: str
    title: str
    what: str
    applies_model: str | None  # a model property it needs ("gqa", "moe", "mla"), None = any model
    needs_hardware: str | None  # "fp8", "bf16", "cuda_sm>=89", "ascend-910b", "avx512", ... None = any
    needs_why: str
    gain: str  # the typical effect, in words, from its source
    source: SourceRef
    support: dict[str, tuple[Support, ...]] = field(default_factory=dict)


@dataclass(frozen=True)
class FrameworkVersion:
    framework: str
    version: str
    engine: str | None  # vLLM: "V0" | "V1"
    released: str
    args_source: SourceRef | None
    args: frozenset[str]
    #: canonical settings' documented defaults in this version (none where the framework computes
    #: them at start, e.g. SGLang's mem_fraction_static), and where they are written
    defaults: dict[str, bool | int | float | str] = field(default_factory=dict)
    defaults_source: SourceRef | None = None

    @property
    def parsed(self) -> Version:
        return parse_version(self.version)


@dataclass(frozen=True)
class HardwareFeatures:
    arch: str  # "sm90", "ascend-310p", "apple-m2", ...
    fp8: bool
    bf16: bool
    source: str

    @property
    def cuda_sm(self) -> int | None:
        return int(self.arch[2:]) if self.arch.startswith("sm") and self.arch[2:].isdigit() else None


def parse_version(text: str) -> Version:
    """A framework's version as PEP 440 (llama.cpp's "b4589" -> 4589); ValueError if it is none."""
    t = text.strip().lstrip("vV")
    if t[:1] == "b" and t[1:].isdigit():
        t = t[1:]
    try:
        return Version(t)
    except InvalidVersion:
        raise ValueError(f"version: {text!r} is not a version") from None


@dataclass(frozen=True)
class Knowledge:
    frameworks: dict[str, dict[str, FrameworkVersion]]
    optimisations: tuple[Optimisation, ...]
    hardware: dict[str, HardwareFeatures]

    def optimisation(self, name: str) -> Optimisation:
        for o in self.optimisations:
            if o.name == name:
                return o
        raise KeyError(name)

    def resolve(self, framework: str, version: str | None) -> tuple[FrameworkVersion | None, str]:
        """(the known version to answer for, a warning or ""): the version itself when known, else
        the nearest known at or below it, else the oldest; the newest when none is given."""
        known = self.frameworks.get(framework)
        if not known:
            return None, f"framework: {framework!r} is not in the knowledge table"
        ordered = sorted(known.values(), key=lambda f: f.parsed)
        if version is None:
            return ordered[-1], f"version: none given, answering for {framework} {ordered[-1].version} (the newest known)"
        try:
            v = parse_version(version)
        except ValueError as e:
            return ordered[-1], f"{e}: answering for {framework} {ordered[-1].version} (the newest known)"
        exact = [f for f in ordered if f.parsed == v or f.parsed.base_version == v.base_version]
        if exact:
            return exact[0], ""
        below = [f for f in ordered if f.parsed <= v]
        pick = below[-1] if below else ordered[0]
        return pick, (f"version: {framework} {version} is not in the knowledge table; answering for the nearest "
                      f"known, {pick.version}")

    def support(self, opt: Optimisation, framework: str, version: str) -> Support | None:
        """The row of ``opt`` for ``framework`` covering ``version`` (None: the table does not say)."""
        v = parse_version(version)
        for row in opt.support.get(framework, ()):
            if row.covers(v):
                return row
        return None


def _support(fw: str, opt: str, d: Any) -> Support:
    where = f"optimisation {opt}, {fw}"
    spec = str(d.get("versions") or "")
    try:
        SpecifierSet(spec)
    except InvalidSpecifier:
        raise ValueError(f"{where}: versions {spec!r} is not a PEP 440 specifier") from None
    un = d.get("unsupported_on") or {}
    if un:
        SourceRef.parse(un.get("source"), f"{where}, unsupported_on")
    return Support(spec, bool(d["supported"]), bool(d.get("default_on", False)), d.get("flag") or None,
                   d.get("off_flag") or None, str(d.get("note") or ""), SourceRef.parse(d.get("source"), where),
                   str(d["value"]) if d.get("value") is not None else None,
                   str(d["off_value"]) if d.get("off_value") is not None else None,
                   tuple(un.get("arch") or ()), str(un.get("why") or ""))


def _optimisation(d: Any) -> Optimisation:
    name = str(d["name"])
    applies = d.get("applies") or {}
    hw = applies.get("hardware") or {}
    return Optimisation(
        name=name, title=str(d.get("title") or name), what=str(d.get("what") or ""),
        applies_model=applies.get("model") or None, needs_hardware=(hw.get("needs") or None) if hw else None,
        needs_why=str(hw.get("why") or "") if hw else "", gain=str(d.get("gain") or ""),
        source=SourceRef.parse(d.get("source"), f"optimisation {name}"),
        support={fw: tuple(_support(fw, name, r) for r in rows) for fw, rows in (d.get("support") or {}).items()})


def parse_knowledge(data: Any) -> Knowledge:
    """The table from its JSON object; ValueError naming the entry when one is malformed."""
    try:
        frameworks: dict[str, dict[str, FrameworkVersion]] = {}
        for fw, f in data["frameworks"].items():
            frameworks[fw] = {}
            for ver, v in (f.get("versions") or {}).items():
                parse_version(ver)
                src, dsrc = v.get("args_source"), v.get("defaults_source")
                defaults = dict(v.get("defaults") or {})
                if defaults and not dsrc:
                    raise ValueError(f"{fw} {ver}: defaults need a defaults_source")
                frameworks[fw][ver] = FrameworkVersion(fw, ver, v.get("engine"), str(v.get("released") or ""),
                                                       SourceRef.parse(src, f"{fw} {ver}") if src else None,
                                                       frozenset(v.get("args") or ()), defaults,
                                                       SourceRef.parse(dsrc, f"{fw} {ver} defaults") if dsrc else None)
        opts = tuple(_optimisation(o) for o in data["optimisations"])
        hardware = {k: HardwareFeatures(str(h["arch"]), bool(h.get("fp8")), bool(h.get("bf16")), str(h.get("source", "")))
                    for k, h in (data.get("hardware_features") or {}).items()}
    except (KeyError, TypeError, AttributeError) as e:
        raise ValueError(f"knowledge table: malformed ({type(e).__name__}: {e})") from None
    return Knowledge(frameworks, opts, hardware)


@functools.lru_cache(maxsize=1)
def knowledge() -> Knowledge:
    """The shipped table (presets/optimisations.json)."""
    return parse_knowledge(json.loads(PRESET.read_text()))
