"""The replay of a tree step (patch 0009's verify batch): each node sees its ancestors only.

With the reference kernels (--exact) a row's logits do not depend on the other rows of its batch,
and a cell the mask hides adds exactly zero, so the rows of a tree's accepted path must equal, bit
for bit, the rows of a chain batch carrying that path alone. A node that saw a sibling or a cousin
would change them. The step after a tree reads the cache the tree left, which the server (patch
0010) and the replay lay out as the chain's: the accepted nodes moved next to the root. Its row
must be the chain's too: a dropped branch left visible, an accepted node not moved into sequence 0,
or one left where it was (the next tokens then fill the holes of the dropped ones, and attention
sums in another order) would change it."""

from __future__ import annotations

import numpy as np
import pytest

from dflash_gguf.validation.replay import Replay, ServerContext
from dflash_gguf.validation.server_steps import Step

PROMPT = [1, 450, 3681, 310, 278, 3303, 338]
# root 7 at position 7; nodes: 20 (depth 1), 22 under 20 (d2), 23 under 22 (d3), 21 under the root
# (d1), 24 under 21 (d2), 25 under 22 (d3, a sibling of 23)
TREE = Step(position=7, width=7, last=7, drafts=[20, 22, 23, 21, 24, 25], parents=[0, 1, 2, 0, 4, 2])


def _logits(rows):
    return [(r.position, r.width, r.top_ids.tolist(), r.top_logits.tobytes()) for r in rows]


@pytest.mark.integration
@pytest.mark.parametrize("path", [[1, 2, 3], [1, 2], [], [1, 2, 6], [4, 5]])
def test_tree_rows_and_the_cache_after_them_are_the_chains(trained_pair, llama_bin, path):
    accepted = [TREE.drafts[j - 1] for j in path]
    emitted = [7, *accepted, 30, 31]  # the prompt's token, the path, the target's own, one plain step
    after = Step(position=len(PROMPT) + len(accepted) + 1, width=1, last=30)
    chain = Step(position=7, width=len(accepted) + 1, last=7, drafts=accepted, accepted=len(accepted))
    tree = Step(**{**TREE.__dict__, "accepted": len(accepted), "path": path or None})
    context = ServerContext(n_ctx=128, n_seq=8, kv_unified=True, repack=False, threads=1, reference_kernels=True)
    with Replay(trained_pair["target"], context, bin_dir=llama_bin) as replay:
        tree_rows = replay.run(PROMPT, emitted, [tree, after])
        chain_rows = replay.run(PROMPT, emitted, [chain, after])
    assert len(tree_rows) == len(chain_rows) == len(emitted)
    widths = [r.width for r in tree_rows]
    assert widths == [len(PROMPT)] + [7] * (len(accepted) + 1) + [1]
    same = [(a.position, a.top_ids.tolist(), a.top_logits.tobytes()) == (b.position, b.top_ids.tolist(),
                                                                          b.top_logits.tobytes())
            for a, b in zip(tree_rows, chain_rows)]
    assert all(same), same  # the prompt's row, the root's, every accepted node's and the step after's
    assert np.isfinite(tree_rows[-1].top_logits).all()


@pytest.mark.integration
def test_a_tree_whose_path_is_not_the_emitted_tokens_stops_the_replay(trained_pair, llama_bin):
    tree = Step(**{**TREE.__dict__, "accepted": 1})
    context = ServerContext(n_ctx=128, n_seq=8, kv_unified=True, threads=1)
    with Replay(trained_pair["target"], context, bin_dir=llama_bin) as replay:
        rows = replay.run(PROMPT, [7, 99, 30], [tree])  # 99 is no child of the root
    assert len(rows) == 1  # the prompt's row only: the tree step proves nothing it did not produce
