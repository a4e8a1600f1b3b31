"""How many prompt tokens OpenVINO's ContinuousBatchingPipeline takes from its prefix cache:
a mirror of the pipeline's block index, since the pipeline does not say.

With ``enable_prefix_caching`` the pipeline's block manager names every KV block by a hash
of all the tokens up to the block's end. At ``add_request`` it restores the longest run of
the new prompt's blocks it holds and evaluates only the rest (a prompt restored to its end
still evaluates its last token, for the logits it samples from). The blocks of a finished
sequence stay in the pool; when a block is needed and none was ever used, the one restored
least recently is overwritten. openvino-genai 2026.4 reports neither the restored count
(``SequenceGroup::get_num_cached_tokens`` is internal) nor the index, so edgekit keeps this
mirror, and ``SeqStep.cached`` says what it claims.

The mirror claims what the pipeline restores, or less, never more:

- whole blocks only (the pipeline also restores a partial last block whose exact content
  it holds: a conversation continued after its reply);
- a block enters the mirror once it is computed: a prompt's blocks when the request's first
  token comes, the generated ones when the request ends or is removed;
- overwrites: the mirror counts every block the pipeline can have handed out (each block a
  request needs beyond the ones it restored, counted before the step that allocates it).
  While the count is within the pool, the pipeline has handed out only blocks never used,
  and overwritten none. Past it, each new block may overwrite any block no sequence holds,
  so the mirror forgets every block no running request holds.

So a shared system prompt that running requests keep restoring stays known; a conversation
left idle while other traffic fills the pool is forgotten here (the pipeline may still
hold it, and then restores more than was reported).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

# A block: the number of tokens up to its end, and a hash of all of them (chained block by
# block, as the pipeline's Sequence::get_hash is).
Key = tuple[int, int]


def block_keys(tokens: Sequence[int], block: int) -> list[Key]:
    """The key of every whole block of ``tokens``, in order."""
    keys: list[Key] = []
    chain = 0
    for end in range(block, len(tokens) + 1, block):
        chain = hash((chain, tuple(tokens[end - block : end])))
        keys.append((end, chain))
    return keys


@dataclass(kw_only=True)
class _Held:
    """The blocks one live request holds in the mirror."""

    keys: list[Key]  # a prefix of its tokens' block keys
    restored: int  # blocks restored and never written (the pipeline allocated no copy)
    issued: int = 0  # blocks counted as handed out to it


class PrefixMirror:
    """The pipeline's prefix index as edgekit can know it (see the module text): ``block``
    tokens a block, ``blocks`` in the pool."""

    def __init__(self, *, block: int, blocks: int) -> None:
        self._block = block
        self._fresh = blocks  # blocks never handed out, at least (the pipeline's free list)
        self._users: dict[Key, int] = {}  # every block known -> live requests holding it
        self._held: dict[int, _Held] = {}

    def start(self, rid: int, prompt: Sequence[int]) -> int:
        """``rid`` was added with ``prompt``: the prompt tokens the pipeline restored (at
        least). It then holds those blocks."""
        keys = block_keys(prompt, self._block)
        hit = 0
        while hit < len(keys) and keys[hit] in self._users:
            hit += 1
        cached = min(hit * self._block, len(prompt) - 1)
        restored = cached // self._block  # a block restored whole and then written is copied
        held = _Held(keys=keys[:restored], restored=restored)
        for key in held.keys:
            self._users[key] += 1
        self._held[rid] = held
        self.grow(rid, len(prompt))
        return cached

    def grow(self, rid: int, tokens: int) -> None:
        """``rid``'s sequence will hold ``tokens`` tokens after the next step: count the
        blocks the pipeline may hand out for them."""
        held = self._held.get(rid)
        if held is None:
            return
        need = -(-tokens // self._block) - held.restored
        if need > held.issued:
            self._issue(need - held.issued)
            held.issued = need

    def computed(self, rid: int, tokens: Sequence[int]) -> None:
        """``rid``'s KV cache holds ``tokens`` (its prompt, and what it generated): its
        whole blocks are known from now on."""
        held = self._held.get(rid)
        if held is None:
            return
        for key in block_keys(tokens, self._block)[len(held.keys) :]:
            self._users[key] = self._users.get(key, 0) + 1
            held.keys.append(key)

    def release(self, rid: int, tokens: Sequence[int] = ()) -> None:
        """``rid`` ended or was removed with ``tokens`` computed (empty: no more than when
        it was last told): its blocks stay in the pool, held by no one."""
        self.computed(rid, tokens)
        held = self._held.pop(rid, None)
        if held is None:
            return
        for key in held.keys:
            self._users[key] -= 1

    def clear(self) -> None:
        """Forget every block (the pipeline did something the mirror cannot follow)."""
        self._users.clear()
        self._held.clear()
        self._fresh = -1

    def _issue(self, blocks: int) -> None:
        self._fresh -= blocks
        if self._fresh < 0:  # a block no one holds may have been overwritten: forget them all
            self._users = {key: n for key, n in self._users.items() if n > 0}
