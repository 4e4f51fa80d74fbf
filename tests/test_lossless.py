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
