"""Feature provenance: what made a bag's tile features (extractor, its weights digest, tile side in microns and in
pixels, the slide's microns per pixel, stain normalisation, the file layout), read from the bag's HDF5 attributes.

One feature space per cohort: the bags of a training table must agree on :data:`SPACE_FIELDS` (extractor, weights,
tile side in microns, tile side in pixels, stain normalisation); :func:`check_one_space` refuses a table that mixes
them, before the first epoch, in one line naming two files and their values, unless the data config sets
``mixed_feature_spaces: true`` (then the checkpoint records it, ``meta["features"]["mixed_feature_spaces"]``). A
field one bag records and another does not counts as a disagreement; the slide's mpp and the file layout do not
(scanners differ, and the tile side in microns fixes what a tile shows).
Training records the provenance of its training bags in the checkpoint (``meta["features"]``: one value per field
when every training bag agrees, else the sorted list of the values seen; a field no bag records is left out).
eval, predict and explain compare every bag they are given with it (:func:`differences`) and refuse a bag made
otherwise in one line naming the file, the field, the model's value and the bag's (:func:`refusal`); an explicit
option (``--accept-features``) uses such bags and the outputs say so. A field the bag does not record is not
compared (a CLAM file from another tool may keep no attributes). A bag whose feature width is not the model's is
refused naming the extractor the model expects (:func:`width_refusal`).
"""

from __future__ import annotations

from pathlib import Path

from ..errors import UserError

#: The recorded fields, in the order messages name them.
FIELDS = ("extractor", "extractor_digest", "patch_size_um", "patch_size_px", "mpp", "stain_norm", "layout")
#: The fields every bag of one cohort shares (:func:`check_one_space`).
SPACE_FIELDS = ("extractor", "extractor_digest", "patch_size_um", "patch_size_px", "stain_norm")
#: The data key that lets a cohort mix feature spaces knowingly, and the checkpoint's record of it.
MIXED_KEY = "mixed_feature_spaces"
#: HDF5 attributes that may hold the extractor's weights digest, first found wins.
DIGEST_ATTRS = ("extractor_sha256", "extractor_digest", "extractor_weights_sha256", "weights_sha256")
#: Relative tolerance of the numeric fields: scanners of one nominal magnification differ by a few percent in mpp.
TOLERANCE = {"patch_size_um": 0.01, "mpp": 0.1}
ACCEPT_OPTION = "--accept-features"


def _number(value) -> float | None:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if number > 0 and number == number and number != float("inf") else None


def _text(value) -> str | None:
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    return value if isinstance(value, str) and value else None


def of_attrs(attrs: dict, layout: str | None) -> dict:
    """The provenance fields an HDF5 bag's attributes record (``layout``: "clam" or "stamp"); absent ones left out.
    mpp is rounded to 4 significant digits, the tile side in microns to 3 decimals."""
    digest = next((_text(attrs.get(key)) for key in DIGEST_ATTRS if _text(attrs.get(key))), None)
    size = _number(attrs.get("patch_size_um", attrs.get("tile_size_um")))
    pixels = _number(attrs.get("patch_size_px", attrs.get("tile_size_px")))
    mpp = _number(attrs.get("mpp"))
    found = {"extractor": _text(attrs.get("extractor")), "extractor_digest": digest,
             "patch_size_um": None if size is None else round(size, 3),
             "patch_size_px": None if pixels is None else int(round(pixels)),
             "mpp": None if mpp is None else float(f"{mpp:.4g}"), "stain_norm": _text(attrs.get("stain_norm")),
             "layout": layout}
    return {key: value for key, value in found.items() if value is not None}


def of_bag(path: Path) -> dict:
    """The provenance of one bag file (:func:`of_attrs`); {} for a file that does not open (its reader says why)."""
    import h5py

    from .readers.bags import LAYOUTS, WRITTEN_LAYOUTS

    try:
        with h5py.File(path, "r") as f:
            layout = next((name for key, name in zip(LAYOUTS, WRITTEN_LAYOUTS) if key in f), None)
            return of_attrs(dict(f.attrs), layout)
    except (OSError, ValueError):
        return {}


def collect(paths) -> dict:
    """The provenance of the training bags ``paths``: per field the one value all recording bags share, else the
    sorted list of the values seen; a field no bag records is left out."""
    seen: dict[str, set] = {}
    for path in paths:
        for key, value in of_bag(path).items():
            seen.setdefault(key, set()).add(value)
    return {key: (next(iter(values)) if len(values) == 1 else sorted(values, key=str))
            for key in FIELDS if (values := seen.get(key))}


def _values(found: dict, keys: list[str]) -> str:
    """``key value, ...`` of ``keys`` in a bag's provenance ``found`` ("unrecorded" where it records none)."""
    return ", ".join(f"{key} {_shown(found[key]) if key in found else 'unrecorded'}" for key in keys)


def check_one_space(paths, mixed: bool = False) -> bool:
    """The bags ``paths`` of one cohort share one feature space (:data:`SPACE_FIELDS`), else a one-line UserError
    naming two files that differ and their values (a field one records and the other does not counts), unless
    ``mixed`` (the data key ``mixed_feature_spaces``). -> whether they mix feature spaces (``mixed`` only)."""
    first, first_space, mixes = None, {}, False
    for path in paths:
        space = {key: value for key, value in of_bag(Path(path)).items() if key in SPACE_FIELDS}
        if first is None:
            first, first_space = path, space
            continue
        differ = [key for key in SPACE_FIELDS if (key in space) != (key in first_space) or (
            key in space and not _same(key, first_space[key], space[key]))]
        if differ and not mixed:
            raise UserError(f"bags of two feature spaces in one cohort: {first} has {_values(first_space, differ)}, "
                            f"{path} has {_values(space, differ)}; extract every slide alike, or set "
                            f"data.{MIXED_KEY}: true to mix them knowingly")
        mixes = mixes or bool(differ)
    return mixes


def check_recorded(features, source: str) -> None:
    """The schema of a checkpoint's ``features``: a mapping of known fields to a string or positive number, or a
    list of them, and perhaps ``mixed_feature_spaces: true``; a one-line UserError naming ``source`` otherwise."""
    def plain(value) -> bool:
        return (isinstance(value, str) and len(value) <= 4096) or (
            isinstance(value, (int, float)) and not isinstance(value, bool) and _number(value) is not None)

    fields = {key: value for key, value in features.items() if key != MIXED_KEY} \
        if isinstance(features, dict) and features.get(MIXED_KEY, True) is True else None
    if fields is None or not set(fields) <= set(FIELDS) or not all(
            plain(v) or (isinstance(v, list) and 1 <= len(v) <= 1024 and all(plain(x) for x in v))
            for v in fields.values()):
        raise UserError(f"{source}: features must map {', '.join(FIELDS)} to a value or a list of values "
                        f"(got {str(features)[:200]})")


def _same(key: str, expected, found) -> bool:
    if key in TOLERANCE and _number(expected) is not None and _number(found) is not None:
        return abs(float(expected) - float(found)) <= TOLERANCE[key] * max(float(expected), float(found))
    return str(expected) == str(found)


def _shown(value) -> str:
    if isinstance(value, list):
        return " or ".join(_shown(v) for v in value)
    return f"{value:g}" if isinstance(value, float) else str(value)


def differences(expected: dict | None, found: dict) -> list[str]:
    """``field found (model: expected)`` for each field the bag records that differs from the model's."""
    if not expected:
        return []
    out = []
    for key in FIELDS:
        if key not in expected or key not in found:
            continue
        allowed = expected[key] if isinstance(expected[key], list) else [expected[key]]
        if not any(_same(key, value, found[key]) for value in allowed):
            out.append(f"{key} {_shown(found[key])} (model: {_shown(expected[key])})")
    return out


def refusal(path, differ: list[str]) -> str:
    """The one-line refusal of a bag whose features were made otherwise than the model's training features."""
    return (f"{path}: features made otherwise than the model's training features: {'; '.join(differ)}; "
            f"{ACCEPT_OPTION} uses them anyway (the outputs record it)")


def expected_extractor(expected: dict | None) -> str:
    """The extractor a model expects, in words: "extractor 'X'" or "an unrecorded extractor"."""
    if not expected or "extractor" not in expected:
        return "an extractor the checkpoint does not record"
    return f"extractor {_shown(expected['extractor'])!r}"


def width_refusal(path, width: int, model_width: int, expected: dict | None) -> str:
    """The one-line refusal of a bag whose feature width is not the model's, naming the extractor it expects."""
    return (f"{path}: features of width {width}, the model takes {model_width}-wide features of "
            f"{expected_extractor(expected)}: extract the slides' features with it")


def check_bags(kind, expected: dict | None, width: int, samples, accept: bool) -> dict[tuple, str]:
    """Every bag of ``samples`` (tuples of paths) against a model taking ``width``-wide features made as
    ``expected`` records (None: an older checkpoint that records nothing), before anything is read or written.

    A width that is not the model's is a UserError (:func:`width_refusal`); a bag made otherwise is a UserError
    (:func:`refusal`) unless ``accept``. -> {paths: "field found (model: expected); ..."} for the accepted
    samples that differ. Inputs that are not bags (``kind.instances`` false) and unreadable files (their reader
    reports them) pass."""
    from .readers.bags import slide_shape

    notes: dict[tuple, str] = {}
    if not kind.instances:
        return notes
    for paths in samples:
        differ = []
        for path in paths:
            try:
                found_width = slide_shape(Path(path))[1]
            except (OSError, ValueError):
                continue
            if found_width != width:
                raise UserError(width_refusal(path, found_width, width, expected))
            these = differences(expected, of_bag(Path(path)))
            if these and not accept:
                raise UserError(refusal(path, these))
            differ += [f"{Path(path).name}: {d}" if len(paths) > 1 else d for d in these]
        if differ:
            notes[tuple(Path(p) for p in paths)] = "; ".join(differ)
    return notes
