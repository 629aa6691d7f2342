"""Sequences that share prefixes, packed as a tree: each shared token is in the pass once.

The datums of one GRPO group start with the same prompt, and an agent whose history is
rewound (a dropped reply, a summary) starts each call with the same system and task messages.
Right-padded, a forward pass runs those tokens once per row; packed as a tree, once in all.

A :class:`PrefixTree` holds every distinct prefix of the rows once, as a node: its token, its
depth (the position id the model gets) and its parent. Parents come before their children, so
the packed tokens form one row in which a node attends to exactly its ancestors and itself
(:meth:`PrefixTree.attention_mask`). Each node's hidden state then equals the one its position
has in any row that holds it alone, and so does every logprob read from it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

__all__ = ["PrefixTree", "Trie"]


class Trie:
    """Node ids of token prefixes, numbered in insertion order."""

    def __init__(self) -> None:
        self._children: dict[tuple[int, int], int] = {}
        self.tokens: list[int] = []
        self.depths: list[int] = []
        self.parents: list[int] = []

    def __len__(self) -> int:
        return len(self.tokens)

    def matched(self, row: Sequence[int]) -> int:
        """How many of ``row``'s leading tokens already have nodes."""
        node = -1
        for depth, token in enumerate(row):
            found = self._children.get((node, token))
            if found is None:
                return depth
            node = found
        return len(row)

    def insert(self, row: Sequence[int]) -> list[int]:
        """The node ids of ``row``'s prefixes, one per token, adding those that are new."""
        path: list[int] = []
        node = -1
        for depth, token in enumerate(row):
            key = (node, token)
            found = self._children.get(key)
            if found is None:
                found = len(self.tokens)
                self._children[key] = found
                self.tokens.append(token)
                self.depths.append(depth)
                self.parents.append(node)
            path.append(found)
            node = found
        return path


@dataclass(frozen=True, slots=True)
class PrefixTree:
    """The rows of a right-padded ``[B, T]`` batch as ``N`` tree nodes.

    ``token_ids``, ``position_ids`` and ``parents`` are ``[N]`` int64 (a root's parent is -1);
    ``index[b, t]`` is the node of row ``b``'s first ``t + 1`` tokens, -1 past the row's length.
    """

    token_ids: torch.Tensor
    position_ids: torch.Tensor
    parents: torch.Tensor
    index: torch.Tensor

    @classmethod
    def of(cls, token_ids: torch.Tensor, lengths: torch.Tensor) -> PrefixTree:
        trie = Trie()
        index = torch.full(token_ids.shape, -1, dtype=torch.int64)
        for row, length in enumerate(lengths.tolist()):
            path = trie.insert(token_ids[row, :length].tolist())
            index[row, :length] = torch.tensor(path, dtype=torch.int64)
        return cls(
            token_ids=torch.tensor(trie.tokens, dtype=torch.int64),
            position_ids=torch.tensor(trie.depths, dtype=torch.int64),
            parents=torch.tensor(trie.parents, dtype=torch.int64),
            index=index,
        )

    @property
    def size(self) -> int:
        return int(self.token_ids.shape[0])

    def attention_mask(self, dtype: torch.dtype) -> torch.Tensor:
        """``[1, 1, N, N]`` additive mask: 0 where node ``i`` may attend to node ``j`` (``j`` is
        ``i`` or one of its ancestors), the dtype's lowest value elsewhere."""
        allowed = torch.zeros(self.size, self.size, dtype=torch.bool)
        for row in self.index:
            path = row[row >= 0]
            steps = len(path)
            allowed[path.unsqueeze(1), path.unsqueeze(0)] |= torch.ones(
                steps, steps, dtype=torch.bool
            ).tril()
        mask = torch.zeros(self.size, self.size, dtype=dtype)
        mask.masked_fill_(~allowed, torch.finfo(dtype).min)
        return mask[None, None]
