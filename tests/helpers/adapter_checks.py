"""The adapter checks the coverage table's rows share (tests/nn/test_adapters*.py): build a row's model, decayify it
without the partial-decay warning, and the threads (e) and torch.compile (d) checks, run by each file on its rows."""

from __future__ import annotations

import copy
import warnings

import torch

from helpers.adapter_models import ROWS, from_threads
from resdecay import decayify
from resdecay.nn.decayify import PartialDecayWarning


def build(name):
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # libraries' own deprecation notes
        return ROWS[name][0]()  # every row of the coverage table, the models of mixed add counts too


def quiet_decayify(model, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PartialDecayWarning)
        return decayify(model, **kw)


def threads_do_not_mix_inputs(name) -> None:
    """(e) Four threads calling one decayified model get the single-thread outputs."""
    model, call = build(name)
    quiet_decayify(model, alpha_min=0.5)
    with torch.no_grad():
        want = call(model)
        outs, errors = from_threads(lambda: call(model))
    assert not errors and all(torch.equal(o, want) for o in outs)


def compile_adds_no_graph_break(name) -> None:
    """(d) ``torch._dynamo.explain`` finds no more graph breaks in the decayified model than in the library's."""
    import torch._dynamo as dynamo
    model, call = build(name)
    plain = dynamo.explain(call)(model).graph_break_count
    dynamo.reset()
    decayed = quiet_decayify(copy.deepcopy(model), alpha_min=0.5)
    assert dynamo.explain(call)(decayed).graph_break_count <= plain
    dynamo.reset()
