"""The lossless judgement and the server's step log, on their own (no server: pure functions)."""

from __future__ import annotations

import numpy as np

from dflash_gguf.validation.lossless import MISMATCH, NUMERICAL, judge, noise_by_width
from dflash_gguf.validation.replay import Row
from dflash_gguf.validation.server_steps import read_steps

# llama-server -lv 5 lines as the pinned build writes them (a request of task 3: the prompt's
# token, a draft step of width 4 with 2 drafts accepted, a plain step, and a last draft step the
# request ended inside, so the server logged no count for it)
LOG = """\
0.02.760.505 D slot process_toke: id  0 | task 3 | n_gen = 1, n_remaining = 11, next token:  7042 ' Paris'
0.02.820.025 D dflash draft: seq_id=0 pos=5 id_last=7042 n=7 ids=[30,198,11,12,13,14,15]
0.02.820.076 D slot handle_last_: id  0 | task 3 | generate_draft: id=7042, #tokens=5, #draft=3, pos_next=5
0.03.017.223 D slot process_toke: id  0 | task 3 | n_gen = 2, n_remaining = 10, next token:    30 '.'
0.03.017.223 D slot process_toke: id  0 | task 3 | n_gen = 3, n_remaining = 9, next token:   198 ' '
0.03.017.223 D slot process_toke: id  0 | task 3 | n_gen = 4, n_remaining = 8, next token:   504 'The'
0.03.017.232 D slot   operator(): id  0 | task 3 | accepted 2/3 draft tokens, new n_tokens = 8
0.04.851.941 D slot handle_last_: id  0 | task 3 | slot decode token, id=504, n_ctx = 256, n_tokens = 8, truncated = 0
0.04.851.990 D slot process_toke: id  0 | task 3 | n_gen = 5, n_remaining = 7, next token:    90 'x'
0.04.952.076 D slot handle_last_: id  0 | task 3 | generate_draft: id=90, #tokens=9, #draft=2, pos_next=9
0.05.017.223 D slot process_toke: id  0 | task 3 | n_gen = 6, n_remaining = 6, next token:     2 ''
0.06.000.000 D slot process_toke: id  0 | task 4 | n_gen = 1, n_remaining = 0, next token:     2 ''
"""


def test_steps_are_read_from_the_server_log(tmp_path):
    log = tmp_path / "server.log"
    log.write_text(LOG)
    first, second = read_steps(log)
    assert (first.task, second.task, second.steps) == (3, 4, [])  # a one-token request is a request too
    draft, plain, last = first.steps
    assert (draft.position, draft.width, draft.last, draft.drafts, draft.accepted) == (5, 4, 7042, [30, 198, 11], 2)
    assert draft.emitted(remaining=10) == 3
    assert (plain.position, plain.width, plain.last) == (8, 1, 504)
    assert (last.position, last.width, last.drafts, last.accepted) == (9, 3, [], None)  # drafts not logged
    assert last.emitted(remaining=1) == 1


def _row(width: int, logits: dict[int, float], emitted: int) -> Row:
    ids = sorted(logits, key=lambda t: -logits[t])
    return Row(0, width, ids[0], np.array(ids), np.array([logits[t] for t in ids], dtype=np.float32),
               logits[emitted])


def test_a_near_tie_taken_the_other_way_in_a_wider_batch_is_numerical():
    # new token 1: in its verify batch of 4 the target prefers 7 by 0.02; one token at a time, 8 by 0.01
    spec_rows = [_row(5, {5: 3.0, 6: 1.0}, 5), _row(4, {7: 2.02, 8: 2.00}, 7)]
    plain_rows = [_row(5, {5: 3.0, 6: 1.0}, 5), _row(1, {8: 2.01, 7: 2.00}, 8)]
    j = judge([5, 7], [5, 8], spec_rows, plain_rows)
    assert (j.checked, j.mismatches, j.numerical, j.first_divergence) == (2, 0, 1, 1)
    (f,) = j.findings
    assert (f.kind, f.position, f.speculative_token, f.target_token, f.width) == (NUMERICAL, 1, 7, 8, 4)
    assert f.batch_logits == {"7": 2.02, "8": 2.0} and f.plain_logits == {"7": 2.0, "8": 2.01}
    assert abs(f.margin - 0.02) < 1e-6 and abs(f.plain_margin - 0.01) < 1e-6


def test_a_token_the_target_did_not_choose_in_its_batch_is_a_mismatch_however_close():
    spec_rows = [_row(5, {5: 3.0, 6: 1.0}, 5), _row(4, {8: 2.001, 7: 2.0}, 7)]
    plain_rows = [_row(5, {5: 3.0, 6: 1.0}, 5), _row(1, {8: 2.01, 7: 2.00}, 8)]
    j = judge([5, 7], [5, 8], spec_rows, plain_rows)
    (f,) = j.findings
    assert (f.kind, f.position, f.target_token, f.width) == (MISMATCH, 1, 8, 4)
    # a tolerance, measured from the run's own batching noise, is only used when the replay is not exact
    assert judge([5, 7], [5, 8], spec_rows, plain_rows, tolerance=0.01).findings[0].kind == NUMERICAL


def test_noise_is_the_largest_logit_difference_per_width_where_both_runs_agree():
    spec_rows = [_row(5, {5: 3.0, 6: 1.0}, 5), _row(4, {7: 2.5, 8: 2.0}, 7), _row(4, {1: 9.0, 2: 0.0}, 1)]
    plain_rows = [_row(5, {5: 3.0, 6: 1.0}, 5), _row(1, {7: 2.4, 8: 2.05}, 7), _row(1, {2: 9.0, 1: 0.0}, 2)]
    noise: dict[int, float] = {}
    noise_by_width(spec_rows, plain_rows, agree=2, into=noise)  # the third position is past the divergence
    assert set(noise) == {4, 5} and noise[5] == 0.0 and abs(noise[4] - 0.1) < 1e-6


# A request on a target without recurrent-state snapshots (qwen3next): its prompt split 4 tokens
# before the end, a draft step rejected and rolled back through the checkpoint, the step that
# verifies again the token the target took (it logs one accepted fewer than it took), then a plain step.
RESTORE_LOG = """\
0.01.000.000 D slot update_slots: id  0 | task 7 | main/do_checkpoint = no, pos_min = -1, pos_max = -1
0.01.100.000 D slot update_slots: id  0 | task 7 | main/do_checkpoint = yes, pos_min = 0, pos_max = 9
0.01.200.000 D slot process_toke: id  0 | task 7 | n_gen = 1, n_remaining = 5, next token:   500 'a'
0.01.300.000 D dflash draft: seq_id=0 pos=14 id_last=500 n=3 ids=[1,2,3]
0.01.300.100 D slot update_slots: id  0 | task 7 | created speculative checkpoint (pos_min = 0, pos_max = 13, n_tokens = 14, size = 0.1 MiB, draft = 0.0 MiB)
0.01.300.200 D slot handle_last_: id  0 | task 7 | generate_draft: id=500, #tokens=14, #draft=3, pos_next=14
0.01.400.000 D slot   operator(): id  0 | task 7 | restoring speculative checkpoint (pos_min = 0, pos_max = 13, size = 123)
0.01.500.000 D slot handle_last_: id  0 | task 7 | generate_draft: id=500, #tokens=14, #draft=1, pos_next=14
0.01.600.000 D slot process_toke: id  0 | task 7 | n_gen = 2, n_remaining = 4, next token:   600 'b'
0.01.600.000 D slot process_toke: id  0 | task 7 | n_gen = 3, n_remaining = 3, next token:   700 'c'
0.01.600.100 D slot   operator(): id  0 | task 7 | accepted 0/1 draft tokens, new n_tokens = 16
0.01.700.000 D slot handle_last_: id  0 | task 7 | slot decode token, id=700, n_ctx = 256, n_tokens = 16, truncated = 0
0.01.800.000 D slot process_toke: id  0 | task 7 | n_gen = 4, n_remaining = 2, next token:   800 'd'
"""


def test_a_restore_and_the_step_after_it_are_read_from_the_server_log(tmp_path):
    log = tmp_path / "server.log"
    log.write_text(RESTORE_LOG)
    (task,) = read_steps(log)
    assert task.prompt_batches == [0, 10] and task.tokens == [500, 600, 700, 800] and task.restores == 1
    restored, again, plain = task.steps
    assert (restored.position, restored.width, restored.drafts, restored.restored_from) == (14, 4, [1, 2, 3], 14)
    assert restored.emitted(remaining=3) == 0  # a restored step emits nothing
    assert (again.position, again.width, again.replay, again.accepted, again.restored_from) == (14, 2, True, 0, None)
    assert again.emitted(remaining=3) == 2  # the token it verified again, and its own
    assert (plain.position, plain.width, plain.replay) == (16, 1, False)


def test_the_replay_keeps_as_many_recurrent_snapshots_as_the_server():
    from dflash_gguf.validation.replay import ServerContext

    speculative = ["-m", "t.gguf", "-md", "d.gguf", "--spec-type", "draft-dflash", "--spec-draft-n-max", "7"]
    assert ServerContext.from_args(speculative, 512).n_rs_seq == 7  # llama-server: need_n_rs_seq() = n_max
    assert ServerContext.from_args(["-m", "t.gguf"], 512).n_rs_seq == 0  # the target alone keeps none


def test_replay_threads_follow_the_command_line_then_llama_arg_threads(monkeypatch):
    """The replay runs with the threads the server ran with: -t, else LLAMA_ARG_THREADS (which
    llama-server reads for -t), else llama.cpp's default."""
    from dflash_gguf.validation.replay import ServerContext

    monkeypatch.setenv("LLAMA_ARG_THREADS", "3")
    assert ServerContext.from_args(["-m", "t.gguf"], 512).threads == 3
    assert ServerContext.from_args(["-m", "t.gguf", "-t", "2"], 512).threads == 2
    for unusable in ("abc", "0", ""):
        monkeypatch.setenv("LLAMA_ARG_THREADS", unusable)
        assert ServerContext.from_args(["-m", "t.gguf"], 512).threads is None


# a tree step (patch 0009): 4 nodes under the root 7042 at pos 5 - 30 (depth 1), 31 (depth 1, a
# sibling), 198 (under 30), 11 (under 198) - of which 30, 198 were accepted, then the target's 504
TREE_LOG = """\
0.00.100.000 I srv   load_model: spec tree: budget=4 n_seq_max=5 kv_unified=1
0.02.760.505 D slot process_toke: id  0 | task 3 | n_gen = 1, n_remaining = 11, next token:  7042 ' Paris'
0.02.820.025 D dflash draft: seq_id=0 pos=5 id_last=7042 n=4 ids=[30,31,198,11]
0.02.820.050 D slot handle_last_: id  0 | task 3 | spec tree: slot=0 pos=5 last=7042 n=4 tokens=[30,31,198,11] parents=[0,0,1,3]
0.02.820.076 D slot handle_last_: id  0 | task 3 | generate_draft: id=7042, #tokens=5, #draft=4, pos_next=5
0.03.017.223 D slot process_toke: id  0 | task 3 | n_gen = 2, n_remaining = 10, next token:    30 '.'
0.03.017.223 D slot process_toke: id  0 | task 3 | n_gen = 3, n_remaining = 9, next token:   198 ' '
0.03.017.223 D slot process_toke: id  0 | task 3 | n_gen = 4, n_remaining = 8, next token:   504 'The'
0.03.017.230 D slot   operator(): id  0 | task 3 | spec tree accepted: slot=0 path=[1,3]
0.03.017.232 D slot   operator(): id  0 | task 3 | accepted 2/4 draft tokens, new n_tokens = 8
"""


def test_a_tree_step_is_read_from_the_server_log(tmp_path):
    from dflash_gguf.validation.server_steps import tree_memory, tree_state

    log = tmp_path / "server.log"
    log.write_text(TREE_LOG)
    (task,) = read_steps(log)
    (step,) = task.steps
    assert (step.position, step.width, step.drafts, step.parents, step.path, step.accepted) == \
        (5, 5, [30, 31, 198, 11], [0, 0, 1, 3], [1, 3], 2)
    assert [step.depth(j) for j in range(5)] == [0, 1, 1, 2, 3]
    assert step.walk([30, 198]) == [1, 3] and step.walk([31]) == [2] and step.walk([198]) is None
    assert step.emitted(remaining=10) == 3
    assert tree_memory(log) == (5, True) and tree_state(log) == {"budget": 4, "n_seq_max": 5, "kv_unified": True}
    chain = tmp_path / "chain.log"
    chain.write_text(LOG)
    assert tree_memory(chain) is None and not any(s.is_tree for t in read_steps(chain) for s in t.steps)
    off = tmp_path / "off.log"
    off.write_text("0.00.100.000 W srv   load_model: spec tree: off: a sliding-window target; verifying the chain\n")
    assert tree_state(off) == {"off": "a sliding-window target"} and tree_memory(off) is None
