"""Loaders of test_resume.py, and the fresh process that resumes them.

Run as a script: ``resume_child.py IN OUT`` reads a pickled list of
(config, state) from IN, and for each builds the loader anew, loads the
state and runs the rest of the training loop (the rest of the saved epoch,
then the following epochs up to config["epochs"]), writing the batches it
got (pickled lists of NumPy arrays) to OUT.
"""

from __future__ import annotations

import pickle
import sys
from typing import Any, Dict, List, Tuple

import numpy as np
import torch
from torch.utils.data import DataLoader

from patchstore.torch import BatchLoader, PatchDataset, SliceDataset, collate, slice_collate

Batch = List[np.ndarray]


def arrays(batch: Any) -> Batch:
    """A batch as a list of NumPy copies (dict values in field order, or tuple items)."""
    parts = batch.values() if isinstance(batch, dict) else batch
    return [t.numpy().copy() for t in parts]


def build(cfg: Dict[str, Any]) -> Tuple[Any, Any]:
    """(object holding the state, iterable of batches) for a config.

    cfg: kind ("batch", "patch", "slice"), store, rank, world_size, workers, method (fork/spawn),
    stateful (torchdata's StatefulDataLoader instead of DataLoader).
    """
    kind, w = cfg["kind"], cfg["workers"]
    loader_cls = DataLoader
    if cfg.get("stateful"):
        from torchdata.stateful_dataloader import StatefulDataLoader as loader_cls  # noqa: N813
    kw: Dict[str, Any] = {"num_workers": w}
    if w:
        kw.update(multiprocessing_context=cfg["method"], persistent_workers=True)
    if kind == "batch":
        obj = BatchLoader(cfg["store"], ["rgb", "mask"], patch_size=16, batch_size=4, require="mask", seed=3,
                          rank=cfg["rank"], world_size=cfg["world_size"])
        if w == 0 and not cfg.get("stateful"):
            return obj, obj  # iterated directly in the training process
        return obj, loader_cls(obj, batch_size=None, **kw)
    if kind == "patch":
        obj = PatchDataset(cfg["store"], ["rgb", "mask"], 16, require="mask", seed=3)
        sampler = obj.batch_sampler(3, shuffle=True, rank=cfg["rank"], world_size=cfg["world_size"])
        return obj, loader_cls(obj, batch_sampler=sampler, collate_fn=collate, **kw)
    obj = SliceDataset(cfg["store"], ("MR", "CT"), crop=8, flip=True, rot90=True, seed=3)
    sampler = obj.batch_sampler(4, shuffle=True, rank=cfg["rank"], world_size=cfg["world_size"])
    return obj, loader_cls(obj, batch_sampler=sampler, collate_fn=slice_collate, **kw)


def resume(cfg: Dict[str, Any], state: Dict[str, Any]) -> List[Batch]:
    """The training loop after a restart: load the state, then run to the end of cfg["epochs"]."""
    obj, loader = build(cfg)
    if cfg.get("stateful"):
        loader.load_state_dict(state["loader"])
        start = state["epoch"]
    else:
        obj.load_state_dict(state)
        start = state["epoch"]
    out: List[Batch] = []
    for epoch in range(start, cfg["epochs"]):
        obj.set_epoch(epoch)
        for batch in loader:
            out.append(arrays(batch))
    return out


def main() -> None:
    torch.set_num_threads(1)
    with open(sys.argv[1], "rb") as f:
        jobs = pickle.load(f)
    results = [resume(cfg, state) for cfg, state in jobs]
    with open(sys.argv[2], "wb") as f:
        pickle.dump(results, f)


if __name__ == "__main__":
    main()
