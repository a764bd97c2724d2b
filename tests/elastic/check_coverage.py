#!/usr/bin/env python3
"""Checks the samples that the ranks of an elastic test job trained (tests/elastic/elastic_worker.cpp
writes DIR/samples.NAME, one "epoch index" line per loaded sample) cover each epoch exactly once.

  check_coverage.py shrink DIR VICTIM   3 ranks, VICTIM lost at step 5 of epoch 0 (batch 32)
  check_coverage.py grow DIR            ranks 0 and 1, and a joiner
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


def exactly_once(indices, what):
    count = collections.Counter(indices)
    missing = SAMPLES - len(set(count) & set(range(SAMPLES)))
    twice = sum(n > 1 for n in count.values())
    if missing or twice:
        sys.exit(f"{what}: {missing} samples missing, {twice} taken more than once")


def shrink(directory, victim):
    taken_before = 5 * BATCH
    survivors = [r for r in range(3) if r != victim]
    dead = records(directory, victim)[0]
    if len(dead) != taken_before:
        sys.exit(f"the victim loaded {len(dead)} samples before the fault, not {taken_before}")
    epoch0 = list(dead)
    for r in survivors:
        mine = records(directory, r)[0]
        # what it trained before the fault, then (after its aborted step) its share of the rest
        epoch0 += mine[:taken_before] + mine[taken_before + BATCH:]
    exactly_once(epoch0, "epoch 0")
    exactly_once([i for r in survivors for i in records(directory, r)[1]], "epoch 1")
    print(f"  epoch 0: {SAMPLES} samples, each once; epoch 1 on 2 ranks: each once")


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
        shrink(sys.argv[2], int(sys.argv[3]))
    else:
        grow(sys.argv[2])
