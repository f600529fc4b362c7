"""Build profiles: the slice sizes an admin offers ("¼ GPU", "½ GPU", "CPU only"), who may
pick which, and how they are shown (KubeSpawner's ``profile_list``, or a form for the local
spawner). Pure functions; every configuration mistake is one sentence.

An admin writes each profile as a dict::

    {"gpus": 0.25,                # 0: CPU only; up to 1: a slice of one GPU; 2, 3…: whole GPUs
     "display_name": "¼ GPU",     # optional: made from gpus
     "description": "...",        # optional: made from gpus
     "slug": "quarter-gpu",       # optional: made from gpus; what user_options["profile"] names
     "groups": ["vision"],        # optional: only members of these JupyterHub groups see it
     "default": True,             # optional: the one a server gets when none is chosen
     "mode": "exclusive",         # optional: another slicing mode than the spawner's
     "kubespawner_override": {}}  # optional, Kubernetes only: e.g. another image
"""

from __future__ import annotations

import html
import re
from dataclasses import dataclass, field
from typing import Iterable

from ..policy.model import GPU
from .modes import CPU, EXCLUSIVE, fraction_text

KEYS = {"gpus", "display_name", "description", "slug", "groups", "default", "mode",
        "kubespawner_override"}
_SLUG = re.compile(r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?\Z")
_NAMES = {125: ("⅛", "eighth"), 250: ("¼", "quarter"), 333: ("⅓", "third"),
          500: ("½", "half"), 667: ("⅔", "two-thirds"), 750: ("¾", "three-quarters")}


@dataclass(frozen=True)
class BuildProfile:
    """One choice of build slice. ``milli`` is the slice in milli-GPUs (0: CPU only),
    ``mode`` the slicing mode (``cpu`` for CPU only), ``groups`` empty for everyone."""

    slug: str
    display_name: str
    description: str
    milli: int
    mode: str
    groups: frozenset[str] = frozenset()
    default: bool = False
    kubespawner_override: dict = field(default_factory=dict, compare=False)

    @property
    def gpus(self) -> str:
        return fraction_text(self.milli)


def display_name(milli: int) -> str:
    if milli == 0:
        return "CPU only"
    if milli in _NAMES:
        return f"{_NAMES[milli][0]} GPU"
    if milli % GPU == 0:
        return f"{milli // GPU} GPU" + ("s" if milli > GPU else "")
    return f"{fraction_text(milli)} GPU"


def default_slug(milli: int) -> str:
    if milli == 0:
        return "cpu"
    if milli in _NAMES:
        return f"{_NAMES[milli][1]}-gpu"
    if milli % GPU == 0:
        return f"{milli // GPU}-gpu" + ("s" if milli > GPU else "")
    return f"gpu-{milli}m"


def default_description(milli: int) -> str:
    if milli == 0:
        return "No GPU. Send GPU work to the train pool with %%train."
    if milli < GPU:
        return (f"{fraction_text(milli)} of one GPU, yours while the server runs: for "
                f"building and debugging; train with %%train.")
    return f"{display_name(milli)} of your own while the server runs."


def parse(entries, *, owner: str, mode: str, modes: Iterable[str]) -> tuple[BuildProfile, ...]:
    """Check an admin's profiles and fill in what they leave out. ``owner`` names the option
    in messages (``GPUShareKubeSpawner.build_profiles``), ``mode`` is the spawner's slicing
    mode and ``modes`` those a profile may name. Raises ``ValueError`` with one sentence."""
    modes = set(modes)
    if not isinstance(entries, (list, tuple)) or not entries:
        raise ValueError(f"{owner} must be a non-empty list of profiles like "
                         f'{{"gpus": 0.25}}')
    out: list[BuildProfile] = []
    for i, entry in enumerate(entries):
        where = f"{owner}[{i}]"
        if not isinstance(entry, dict):
            raise ValueError(f'{where} must be a dict like {{"gpus": 0.25}}, not {entry!r}')
        unknown = sorted(set(entry) - KEYS)
        if unknown:
            raise ValueError(f"{where} has unknown key(s) {', '.join(unknown)}; the keys are "
                             f"{', '.join(sorted(KEYS))}")
        gpus = entry.get("gpus")
        if isinstance(gpus, bool) or not isinstance(gpus, (int, float)) or gpus < 0 or \
                (gpus > 1 and gpus != int(gpus)):
            raise ValueError(f"{where}['gpus'] must be 0 (CPU only), a fraction of one GPU up "
                             f"to 1, or a whole number of GPUs, not {gpus!r}")
        milli = round(gpus * GPU)
        if gpus and not milli:
            raise ValueError(f"{where}['gpus'] is {gpus!r}, less than the smallest slice "
                             f"(0.001 GPU); use 0 for CPU only")
        chosen = entry.get("mode", mode) if milli else CPU
        if milli and chosen not in modes:
            raise ValueError(f"{where}['mode'] must be one of {', '.join(sorted(modes))}, "
                             f"not {chosen!r}")
        if milli > GPU and chosen != EXCLUSIVE and EXCLUSIVE in modes:
            raise ValueError(f"{where} asks for {gpus} GPUs: more than one GPU is given whole, "
                             f'so add "mode": "exclusive"')
        if chosen == EXCLUSIVE and milli % GPU:
            raise ValueError(f"{where} asks for {gpus} GPU in exclusive mode, which gives "
                             f"whole GPUs; use another mode for a fraction")
        slug = entry.get("slug", default_slug(milli))
        if not isinstance(slug, str) or not _SLUG.match(slug):
            raise ValueError(f"{where}['slug'] must be lower-case letters, digits and '-' "
                             f"(at most 63), not {slug!r}")
        groups = entry.get("groups", [])
        if isinstance(groups, str) or not isinstance(groups, (list, tuple, set, frozenset)) \
                or not all(isinstance(g, str) and g for g in groups):
            raise ValueError(f"{where}['groups'] must be a list of JupyterHub group names")
        texts = {k: entry.get(k) for k in ("display_name", "description")}
        for key, value in texts.items():
            if value is not None and not isinstance(value, str):
                raise ValueError(f"{where}['{key}'] must be a string")
        override = entry.get("kubespawner_override", {})
        if not isinstance(override, dict):
            raise ValueError(f"{where}['kubespawner_override'] must be a dict of KubeSpawner "
                             f"options")
        out.append(BuildProfile(
            slug=slug, display_name=texts["display_name"] or display_name(milli),
            description=texts["description"] or default_description(milli), milli=milli,
            mode=chosen, groups=frozenset(groups), default=bool(entry.get("default")),
            kubespawner_override=dict(override)))
    slugs = [p.slug for p in out]
    twice = sorted({s for s in slugs if slugs.count(s) > 1})
    if twice:
        raise ValueError(f"{owner} has two profiles with the slug {twice[0]!r}; give one of "
                         f'them another "slug"')
    if sum(p.default for p in out) > 1:
        raise ValueError(f'{owner} marks more than one profile "default": true; keep one')
    return tuple(out)


def visible_to(profiles: Iterable[BuildProfile], groups: Iterable[str]) -> list[BuildProfile]:
    """The profiles a member of ``groups`` may pick, in the admin's order."""
    groups = set(groups)
    return [p for p in profiles if not p.groups or p.groups & groups]


def choose(profiles: Iterable[BuildProfile], slug: str | None,
           groups: Iterable[str]) -> BuildProfile:
    """The profile ``slug`` names (or the default one) if the user may have it; else
    ``ValueError`` with a sentence for the spawn page."""
    mine = visible_to(profiles, groups)
    if not mine:
        raise ValueError("No build profile is open to you; ask an administrator to add you "
                         "to the group of one.")
    if not slug:
        return next((p for p in mine if p.default), mine[0])
    for p in mine:
        if p.slug == slug:
            return p
    if not isinstance(slug, str):
        slug = repr(slug)
    raise ValueError(f"There is no build profile {slug!r} for you; choose one of "
                     f"{', '.join(p.slug for p in mine)}.")


def kube_profile_list(profiles: Iterable[BuildProfile]) -> list[dict]:
    """KubeSpawner ``profile_list`` entries. GPU resources are not in ``kubespawner_override``:
    the spawner adds them to each pod it builds, so nothing of one spawn sticks to the next."""
    return [{"display_name": p.display_name, "slug": p.slug, "description": p.description,
             "default": p.default, "kubespawner_override": dict(p.kubespawner_override)}
            for p in profiles]


def options_form(profiles: list[BuildProfile], selected: str | None = None) -> str:
    """A spawn-page form with one radio button per profile (the local spawner's)."""
    if not profiles:
        return ""
    selected = selected if any(p.slug == selected for p in profiles) else \
        next((p.slug for p in profiles if p.default), profiles[0].slug)
    rows = [
        f'<div class="radio"><label><input type="radio" name="profile" '
        f'value="{html.escape(p.slug)}"{" checked" if p.slug == selected else ""}> '
        f'<strong>{_text(p.display_name)}</strong> &mdash; '
        f'{_text(p.description)}</label></div>'
        for p in profiles]
    return '<div class="form-group"><p>Build slice</p>\n' + "\n".join(rows) + "\n</div>"


def _text(value: str) -> str:
    # Escaped for HTML, and braces too: JupyterHub renders the form as a Jinja template.
    return html.escape(value).replace("{", "&#123;").replace("}", "&#125;")


def options_from_form(formdata: dict) -> dict:
    """``{"profile": slug}`` from the submitted form (checked later, in ``choose``)."""
    return {"profile": (formdata.get("profile") or [""])[0]}
