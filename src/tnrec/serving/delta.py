"""Applying a complete delta export to a Predictor's dictionaries and graph."""

from __future__ import annotations

from typing import Any

from tnrec import _fileio
from tnrec.errors import CheckpointError
from tnrec.export import DELTA_FORMAT, GRAPH, apply_delta, read_manifest
from tnrec.serving.graph import load_graph

# what a complete delta must describe as the Predictor's export does
DENSE_FIELDS = ("feature_spec", "num_dense", "inputs", "heads")


def generation_of(manifest: dict[str, Any]) -> int | None:
    """The checkpoint generation an export's rows come from (None when unknown)."""
    provenance = manifest.get("provenance") or {}
    gen = provenance.get("generation")
    return gen if isinstance(gen, int) else None


def delta_state(
    manifest: dict[str, Any], dictionaries: dict[str, Any], export: str, path: str
) -> tuple[dict[str, Any], Any, dict[str, Any]]:
    """``(dictionaries, graph, manifest)`` of a Predictor (its export's ``manifest`` and
    ``dictionaries``, loaded from ``export``) with the delta at ``path`` applied.

    Raises:
        CheckpointError: the delta is missing or damaged, for another base, has no
            dense graph, or describes another model.
    """
    delta = read_manifest(path, DELTA_FORMAT)  # every file's sha256 checked
    where = f"Delta export {path}"
    base = generation_of(manifest)
    if base is None or delta["since_generation"] != base:
        raise CheckpointError(
            f"{where} applies to an export of generation {delta['since_generation']} "
            f"({delta['since']}); this Predictor serves generation {base} "
            f"({export}). Apply the deltas in order, or load a full export."
        )
    dense = delta.get("dense")
    if dense is None:
        raise CheckpointError(
            f"{where} has no dense graph (written without the model); write it with "
            "`tnrec export --delta` or export_delta(..., model=...), or load a full export."
        )
    differ = [k for k in DENSE_FIELDS if dense[k] != manifest[k]]
    if differ or sorted(delta["tables"]) != sorted(dictionaries):
        what = ", ".join(differ) or "tables"
        raise CheckpointError(
            f"{where} describes another model than {export} ({what} differ); "
            "load a full export of the new model."
        )
    W = manifest["routing"]["num_shards"]
    updated = {
        t: {
            r: apply_delta(keys, weights, path, t, shard=(r, W) if W > 1 else None)
            for r, (keys, weights) in shards.items()
        }
        for t, shards in dictionaries.items()
    }
    graph = load_graph(_fileio.join(path, GRAPH))
    new = dict(manifest)
    new["tables"] = {
        t: {**doc, "count": sum(int(k.shape[0]) for k, _ in updated[t].values())}
        for t, doc in manifest["tables"].items()
    }
    to_day = delta["to"].partition("/")[0]
    provenance = dict(manifest.get("provenance") or {})
    provenance.update(dt=to_day, generation=delta["to_generation"])
    new.update(provenance=provenance, dt=to_day)
    return updated, graph, new
