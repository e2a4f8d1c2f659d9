"""Checkpoints: everything a hybrid-mpi job needs to resume, in one directory.

    kvhybrid.save_checkpoint(trainer, "ckpt", step=step)      # every rank, between steps
    step = kvhybrid.load_checkpoint(trainer, "ckpt")["step"]  # every rank of the new job

What a checkpoint holds, whatever the mode and wherever the state lives:

- every Parameter's value: dense ones as the Trainer holds them, sparse weights from
  where their rows live (the parameter servers, or every rank);
- the optimizer's state and update counts: the store's (it updates keys on every rank),
  the Trainer's (``update_on_kvstore=False``), and every parameter server's (the keys
  the servers update: ``ps/server.py`` saves them there);
- every value the servers hold: the weights of several client groups, the center
  variables of ``hybrid-mpi-elastic``; each client group's own weights and state when
  groups differ (async, elastic), and the elastic step counters;
- the job's shape and ``KVHYBRID_PARTITIONS`` (the partition tuner's choice): a
  checkpoint resumes only on a job of the same shape, and the error says what to set.

A synchronous job resumed from a checkpoint continues exactly as if uninterrupted. The
directory must be reachable at the same path from every worker and server (a shared
filesystem across hosts). Files go to ``DIR.partial`` first, renamed to ``DIR`` once
complete: a job killed while saving keeps its previous checkpoint.
"""
from __future__ import annotations

import json
import logging
import os
import pickle
import shutil
import time
import uuid
from typing import Dict, List, Optional

import numpy as np
import mxnet as mx

from ..errors import KeyValueError, KVHybridError
from ..kvstore.keys import Key
from ..kvstore.ps import server as ps_server

log = logging.getLogger("kvhybrid")

FORMAT = 1
#: how long the master waits for the servers' files of a save or load command
SERVER_FILE_WAIT = 30.0


def save_checkpoint(trainer: mx.gluon.Trainer, directory: str, step: Optional[int] = None) -> None:
    """Save the job's training state into ``directory`` (replacing it); every rank of every
    client group calls it at the same point (between steps). ``step`` is kept for
    ``load_checkpoint`` to return."""
    store = _store_of(trainer, "save_checkpoint")
    state = store.resume_state()
    directory = os.path.abspath(directory)
    store.agree_on("save_checkpoint", lambda: (None, f"save_checkpoint({directory!r}, {step})"))
    partial = directory + ".partial"
    token = _token(store)
    if store.rank == 0:
        shutil.rmtree(partial, ignore_errors=True)
        os.makedirs(partial)
    _world_barrier(store, state, "the checkpoint folder to be made")   # ...and every push applied

    values = _values(trainer, store, state)   # collective: tables may live on the servers
    client = state.client_rank
    server_states = _server_states_kept(store, state)
    if state.servers is not None and state.servers.ps_rank == 0:
        _save_server_values(state, os.path.join(partial, "servers.params"))
        if server_states:
            state.servers.command("save", partial, token)
            _wait_for_files(store, [ps_server.state_file(partial, r)
                                    for r in range(store.config.num_servers)], "save")
    if store.group.rank == 0 and (state.groups_differ or client == 0):
        mx.nd.save(os.path.join(partial, f"weights-{client}.params"),
                   {str(k): v for k, v in values.items()})
        with open(os.path.join(partial, f"optimizer-{client}.states"), "wb") as f:
            pickle.dump(_optimizer_state(trainer, state), f)
    if store.rank == 0:
        with open(os.path.join(partial, "meta.json"), "w") as f:
            json.dump(_meta(trainer, store, state, step, server_states, token), f, indent=1)
    _world_barrier(store, state, f"every rank to write its part of checkpoint {directory}")
    if store.rank == 0:
        _replace(partial, directory)
        log.info("kvhybrid: checkpoint of step %s saved in %s", step, directory)
    _world_barrier(store, state, f"checkpoint {directory} to be renamed into place")


def load_checkpoint(trainer: mx.gluon.Trainer, directory: str) -> Dict[str, object]:
    """Restore what ``save_checkpoint`` saved; every rank of every client group calls it, in
    a job of the same shape, after creating the Trainer and before training. Returns the
    checkpoint's description (``meta.json``), whose ``"step"`` is the ``step`` saved."""
    store = _store_of(trainer, "load_checkpoint")
    state = store.resume_state()
    directory = os.path.abspath(directory)

    def build():
        meta = _read_meta(directory)
        _check_meta(meta, trainer, store, state, directory)
        return meta, f"load_checkpoint of {directory!r}, token {meta['token']}"

    meta = store.agree_on("load_checkpoint", build, f" from {directory!r}")
    store.forget_prefetched()   # rows fetched before the servers' values are replaced
    client = state.client_rank if meta["groups_differ"] else 0
    values = mx.nd.load(os.path.join(directory, f"weights-{client}.params"))
    with open(os.path.join(directory, f"optimizer-{client}.states"), "rb") as f:
        optimizer_state = pickle.load(f)

    for index, param in enumerate(trainer._params):
        value = values[str(index)]
        slot = state.slots.get(index)
        if param._stype == "default":   # not set_data: that would drop the Trainer's store
            for arr in param.list_data():
                value.copyto(arr)
        if slot is not None and slot.value is not None:
            value.copyto(slot.value)
    _restore_servers(store, state, directory, values)
    _set_optimizer_state(trainer, state, optimizer_state)
    _world_barrier(store, state, f"every rank to load checkpoint {directory}")
    log.info("kvhybrid: resumed from the checkpoint of step %s in %s", meta["step"], directory)
    return meta


# -- what is saved ---------------------------------------------------------------------------
def _store_of(trainer, what: str):
    from ..kvstore.store import HybridMPIStore
    if not isinstance(trainer, mx.gluon.Trainer):
        raise KeyValueError(f"{what} needs the gluon.Trainer, got {type(trainer).__name__}")
    if not trainer._kv_initialized:
        trainer._init_kvstore()
    if trainer._params_to_init:
        trainer._init_params()
    if trainer._params_to_init:
        names = ", ".join(p.name for p in trainer._params_to_init)
        raise KeyValueError(f"{what}: parameters {names} are not initialised yet (deferred "
                            "initialisation): run a forward pass first")
    store = trainer._kvstore
    if not isinstance(store, HybridMPIStore):
        raise KeyValueError(f"{what} is for a Trainer on a kvhybrid store (kvstore="
                            f"mx.kv.create('hybrid-mpi')), got {type(store).__name__}")
    return store


def _token(store) -> str:
    """One id for this save, the same on every rank of the group."""
    with store.group.watchdog.waiting("the ranks to agree on a checkpoint id"):
        return store.group.comm.bcast(uuid.uuid4().hex[:12], root=0)


def _world_barrier(store, state, what: str) -> None:
    """Every rank of every group is here, and every master's pushes were applied."""
    with store.group.watchdog.waiting(what):
        store.group.comm.Barrier()
    if state.servers is not None:
        state.servers.barrier()
    with store.group.watchdog.waiting(what):
        store.group.comm.Barrier()


def _server_states_kept(store, state) -> bool:
    """Whether the servers run an optimizer (they then hold optimizer states)."""
    return bool(store.config.num_servers) and state.updater is not None


def _values(trainer, store, state) -> Dict[Key, mx.nd.NDArray]:
    """Each Parameter's value as this group holds it (sparse weights whole, on every rank)."""
    values = {}
    for index, param in enumerate(trainer._params):
        slot = state.slots.get(index)
        if param._stype == "default":
            values[index] = param.list_data()[0].copyto(mx.cpu())
        elif slot.rows_on_servers:
            table = mx.nd.zeros(slot.shape, mx.cpu(), dtype=slot.dtype)
            state.pull_table(index, slot, table)
            values[index] = table
        else:
            values[index] = slot.value.copyto(mx.cpu())
    return values


def _keys_on_servers(state) -> List[Key]:
    """Keys whose dense value lives on the servers (all groups' weights, or the centers)."""
    if not state.dense_on_servers:
        return []
    return [k for k, s in state.slots.items() if not s.rows_on_servers and s.count]


def _save_server_values(state, path: str) -> None:
    keys = _keys_on_servers(state)
    out = [mx.nd.zeros(state.slots[k].shape, mx.cpu(), dtype=state.slots[k].dtype) for k in keys]
    state.servers.pull_many(list(zip(keys, out)))
    if keys:
        mx.nd.save(path, {str(k): v for k, v in zip(keys, out)})


def _optimizer_state(trainer, state) -> Dict[str, object]:
    optimizer = trainer._optimizer
    return {
        "store": state.updater.get_states(False) if state.updater is not None else None,
        "trainer": (trainer._updaters[0].get_states(False)
                    if trainer._updaters and not trainer._update_on_kvstore else None),
        "num_update": optimizer.num_update,
        "counts": optimizer._all_index_update_counts,
        "elastic_steps": dict(state.step_counts),
    }


def _param_specs(trainer) -> List[Dict[str, object]]:
    return [{"name": p.name, "shape": list(p.shape), "dtype": np.dtype(p.dtype).name,
             "stype": p._stype} for p in trainer._params]


def _meta(trainer, store, state, step, server_states: bool, token: str = "") -> Dict[str, object]:
    return {"format": FORMAT, "token": token, "saved": time.strftime("%F %T"),
            "step": step, "store": store.type, "workers": store.num_workers,
            "clients": state.num_clients, "group_size": store.group.size,
            "servers": store.config.num_servers, "partitions": store.config.partitions,
            "row_masters": store.config.row_masters,
            "update_on_kvstore": bool(trainer._update_on_kvstore),
            "groups_differ": state.groups_differ, "server_states": server_states,
            "params": _param_specs(trainer)}


def _replace(partial: str, directory: str) -> None:
    """``partial`` becomes ``directory``; an old ``directory`` goes only once it is."""
    old = None
    if os.path.exists(directory):
        old = f"{directory}.old-{uuid.uuid4().hex[:8]}"
        os.rename(directory, old)
    os.rename(partial, directory)
    if old:
        shutil.rmtree(old, ignore_errors=True)


def _wait_for_files(store, paths: List[str], action: str) -> None:
    """ps-lite reports nothing when a server's command fails (it prints and goes on): the
    files it writes are the only proof."""
    deadline = time.monotonic() + SERVER_FILE_WAIT
    while time.monotonic() < deadline:
        missing = [p for p in paths if not os.path.exists(p)]
        if not missing:
            return
        time.sleep(0.05)
    raise KVHybridError(
        f"parameter server(s) did not {action} their optimizer states: {', '.join(missing)} "
        f"missing after {SERVER_FILE_WAIT:.0f} s. Check the servers' output for a Python "
        "error, that kvhybrid is importable there, and that every server reaches the "
        "checkpoint folder at the same path (a shared filesystem across hosts)")


# -- resuming ----------------------------------------------------------------------------------
def _read_meta(directory: str) -> Dict[str, object]:
    path = os.path.join(directory, "meta.json")
    try:
        with open(path) as f:
            meta = json.load(f)
    except OSError as exc:
        partial = os.path.exists(directory + ".partial")
        raise KeyValueError(f"no checkpoint at {directory!r} ({exc.strerror}: {path})"
                            + (": only an unfinished save (.partial) exists; resume from an "
                               "earlier checkpoint" if partial else
                               ": pass the folder save_checkpoint wrote")) from None
    if meta.get("format") != FORMAT:
        raise KeyValueError(f"checkpoint {directory!r} has format {meta.get('format')}, this "
                            f"kvhybrid reads format {FORMAT}")
    return meta


def _check_meta(meta, trainer, store, state, directory: str) -> None:
    """Refuse a checkpoint that cannot resume this job, naming what differs and the fix."""
    now = _meta(trainer, store, state, None, _server_states_kept(store, state))
    fixes = {"store": "create the same store (mx.kv.create)",
             "workers": "start as many workers (-n)", "clients": "start as many client groups "
             "(--clients)", "group_size": "start as many workers per group",
             "servers": "start as many servers (--servers): each saved its own shard",
             "partitions": f"set KVHYBRID_PARTITIONS={meta['partitions']} (the partition "
                           "tuner's choice when it was saved)",
             "row_masters": "set the same KVHYBRID_ROW_MASTERS (--row-masters)",
             "update_on_kvstore": "create the Trainer with the same update_on_kvstore"}
    for field, fix in fixes.items():
        if meta[field] != now[field]:
            raise KeyValueError(f"checkpoint {directory!r} was saved with {field}="
                                f"{meta[field]!r}, this job has {now[field]!r}: {fix}")
    if meta["params"] != now["params"]:
        saved = {p["name"]: p for p in meta["params"]}
        diff = [p["name"] for p in now["params"] if saved.get(p["name"]) != p] or \
            sorted(set(saved) - {p["name"] for p in now["params"]})
        raise KeyValueError(f"checkpoint {directory!r} holds other parameters than this "
                            f"Trainer (first difference: {diff[:3]}): build the same model "
                            "and pass its parameters in the same order")


def _restore_servers(store, state, directory: str, values) -> None:
    """Put the saved values (and optimizer states) back on the servers: the servers are
    told which keys to set, then each key is pushed once and read back."""
    links = state.servers
    if links is None:
        return
    servers_file = os.path.join(directory, "servers.params")
    dense = mx.nd.load(servers_file) if os.path.exists(servers_file) else {}
    keys = _keys_on_servers(state)
    tables = [k for k, s in state.slots.items() if s.rows_on_servers]
    kids = [kid for k in keys + tables for kid in links.ps_keys(k)]
    token = uuid.uuid4().hex[:12]
    if state.updater is not None and links.ps_rank == 0:
        links.command("load", directory, token, kids)
        _wait_for_files(store, [ps_server.ack_file(directory, r, token)
                                for r in range(store.config.num_servers)], "load")
    links.barrier()   # every server knows which keys to set before any is pushed
    first = links.ps_rank == 0
    sync = links.mode == "dist_sync"
    # ps-lite rank 0 pushes each saved value; in sync mode the servers wait for every
    # master's push, so the others push zeros (no rows), which leave the sum as it is
    if first or sync:
        sent = [dense[str(k)].asnumpy().reshape(-1) for k in keys]
        if not first:
            sent = [np.zeros_like(v) for v in sent]
        links.push_pull_views([(k, v, np.empty_like(v)) for k, v in zip(keys, sent)],
                              new_packs=False)
    for key in tables:
        slot = state.slots[key]
        ids = np.arange(slot.shape[0], dtype=np.int64)
        rows = values[str(key)].asnumpy()
        if first or sync:
            links.push_rows(key, ids if first else ids[:0], rows if first else rows[:0],
                            slot.shape, slot.dtype)
    links.barrier()
    got = [mx.nd.zeros(dense[str(k)].shape, dtype=dense[str(k)].dtype) for k in keys]
    links.pull_many(list(zip(keys, got)))
    for key, value in zip(keys, got):
        _check_restored(key, value.asnumpy(), dense[str(key)].asnumpy())
    for key in tables:
        slot = state.slots[key]
        ids = np.arange(slot.shape[0], dtype=np.int64)
        _check_restored(key, links.pull_rows(key, ids, slot.shape, slot.dtype),
                        values[str(key)].asnumpy())
    for server in range(store.config.num_servers):
        path = ps_server.ack_file(directory, server, token)
        if first and os.path.exists(path):
            os.remove(path)


def _check_restored(key: Key, got: np.ndarray, want: np.ndarray) -> None:
    if not np.array_equal(got, want.reshape(got.shape)):
        raise KVHybridError(f"the parameter servers did not take the checkpoint's value of key "
                            f"{key!r} (largest difference {np.abs(got - want).max():g}): their "
                            "optimizer is not kvhybrid's (was set_optimizer called outside "
                            "kvhybrid?); restart the job")


def _set_optimizer_state(trainer, state, saved) -> None:
    if saved["store"] is not None and state.updater is not None:
        state.updater.set_states(saved["store"])
    if saved["trainer"] is not None:
        for updater in trainer._updaters:
            updater.set_states(saved["trainer"])
    optimizers = {id(trainer._optimizer): trainer._optimizer}
    if state.updater is not None:
        optimizers[id(state.updater.optimizer)] = state.updater.optimizer
    for optimizer in optimizers.values():
        optimizer.num_update = saved["num_update"]
        optimizer._all_index_update_counts = pickle.loads(pickle.dumps(saved["counts"]))
        optimizer._index_update_count = optimizer._all_index_update_counts.setdefault(0, {})
    state.step_counts.clear()
    state.step_counts.update(saved["elastic_steps"])
