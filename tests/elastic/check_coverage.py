#!/usr/bin/env python3
"""Checks the samples that the ranks of an elastic test job trained (tests/elastic/elastic_worker.cpp
writes DIR/samples.NAME, one "epoch index" line per loaded sample) cover each epoch exactly once.

  check_coverage.py shrink DIR RANKS STEP VICTIMS   RANKS ranks, the comma-separated VICTIMS lost
                                                    at step STEP of epoch 0 (batch 32)
  check_coverage.py grow DIR                        ranks 0 and 1, and a joiner
"""
import collections
import sys

SAMPLES = 1152  # the worker's training set
BATCH = 32


def records(directory, name):
    epochs = collections.defaultdict(list)
    with open(f"{directory}/samples.{name}") as lines:
        for line in lines:
            epoch, index = line.split()
            epochs[int(epoch)].append(int(index))
    return epochs


def padding(samples, ranks):
    """The repeats DistributedSampler's rule adds so that `ranks` equal shares cover `samples`."""
    return -samples % ranks


def exactly_once(indices, what, repeats=0):
    """Every sample taken once, except exactly `repeats` taken a second time: the padding of a
    share that does not divide evenly (DistributedSampler's rule, data/epoch_plan.hpp)."""
    count = collections.Counter(indices)
    missing = SAMPLES - len(set(count) & set(range(SAMPLES)))
    extra = sum(n - 1 for n in count.values())
    if missing or extra != repeats or any(n > 2 for n in count.values()):
        sys.exit(f"{what}: {missing} samples missing, {extra} repeats (the padding is {repeats})")


def shrink(directory, ranks, step, victims):
    taken_before = step * BATCH
    survivors = [r for r in range(ranks) if r not in victims]
    epoch0 = []
    for victim in victims:
        dead = records(directory, victim)[0]
        if len(dead) != taken_before:
            sys.exit(f"victim {victim} loaded {len(dead)} samples before the fault, "
                     f"not {taken_before}")
        epoch0 += dead
    # The rest of the epoch, shared anew over the survivors once every victim has gone: each takes
    # an equal share (padded), loaded last. Between its steps before the fault and that share a
    # survivor may have loaded the batch of a step that never completed, once per generation that
    # a victim's death ended (timing: a rank that learns of it first fetches none, and victims
    # killed together may die in different generations, a slow one after the others regrouped
    # with it); those batches lie in the rest, so they are loaded again after the last regroup.
    remaining = SAMPLES - ranks * taken_before
    share = (remaining + padding(remaining, len(survivors))) // len(survivors)
    for r in survivors:
        after = records(directory, r)[0][taken_before:]
        aborted = len(after) - share
        if aborted < 0 or aborted % BATCH or aborted > BATCH * len(victims):
            sys.exit(f"survivor {r} loaded {len(after)} samples of epoch 0 after the fault: its "
                     f"share of {share}, plus {aborted} that are not whole aborted batches, at "
                     f"most one per victim")
        epoch0 += records(directory, r)[0][:taken_before] + after[aborted:]
    rest = padding(SAMPLES - ranks * taken_before, len(survivors))
    exactly_once(epoch0, "epoch 0", rest)
    whole = padding(SAMPLES, len(survivors))
    exactly_once([i for r in survivors for i in records(directory, r)[1]], "epoch 1", whole)
    print(f"  epoch 0: {SAMPLES} samples, each once (and {rest} padding repeats of the rest shared "
          f"anew); epoch 1 on {len(survivors)} ranks: each once (and {whole} padding repeats)")


def grow(directory):
    joiner = records(directory, "joiner")
    if not joiner or 0 in joiner:
        sys.exit("the joiner trained in epoch 0 (before an epoch start) or never")
    for epoch in sorted(joiner):
        exactly_once([i for name in ("0", "1", "joiner") for i in records(directory, name)[epoch]],
                     f"epoch {epoch}")
    print(f"  the joiner trained epochs {sorted(joiner)}; each covers every sample once over 3 ranks")


if __name__ == "__main__":
    if sys.argv[1] == "shrink":
        shrink(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]),
               [int(v) for v in sys.argv[5].split(",")])
    else:
        grow(sys.argv[2])
