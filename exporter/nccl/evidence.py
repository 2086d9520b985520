"""Weighing evidence about which ranks share a node: a union-find whose merges are checked against
"these are on different nodes" constraints, applied strongest first.

Evidence comes in two kinds. A *link* says two things (ranks, processes, node identities) are on
one node; a *separation* says the members of a group are each on a different node (two node
identities, two ranks on one GPU, the two ends of a NET connection where NCCL only uses NET
between nodes). Every piece carries a strength and the line that shows it. Evidence is applied
level by level, strongest first: a link that would join two things a stronger separation keeps
apart is refused, and a separation whose members stronger links already joined does not hold
for them. So a weak inference (two ranks share a busId) never outvotes a stronger one (both print
the same hostname and address), and what was refused is kept to be cited.

Pure: no I/O, no clock, no state beyond one ``EvidenceGraph``.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from dataclasses import dataclass

# Strengths, strongest first.
CERTAIN = 4  # one process, or a P2P/SHM connection (NCCL only uses them inside one host hash)
STRONG = 3  # hostnames and addresses: NCCL's host hash is made from the hostname
MEDIUM = 2  # inferences from NCCL's rules: two ranks on one GPU, NET before 2.14
WEAK = 1  # one hostname with no address: hostnames are not unique across machines
LEVELS = (CERTAIN, STRONG, MEDIUM, WEAK)

Atom = Hashable  # ("r", rank), ("p", process id), ("n", node key), ...


@dataclass(frozen=True)
class Link:
    """``a`` and ``b`` are on one node."""

    a: Atom
    b: Atom
    strength: int
    rule: str  # a few words naming the rule (the reasons and CORPUS.md use the same words)
    line: str | None  # the line that shows it


@dataclass(frozen=True)
class Separation:
    """Each member of ``members`` is on a different node from every other member."""

    members: tuple[Atom, ...]
    strength: int
    rule: str
    line: str | None


class EvidenceGraph:
    """Atoms grouped into nodes by the evidence given to :meth:`weigh`."""

    def __init__(self) -> None:
        self._parent: dict[Atom, Atom] = {}
        # Root -> {separation index: members of that separation inside this group}.
        self._apart: dict[Atom, dict[int, int]] = {}
        self._separations: list[Separation] = []
        self.refused: list[tuple[Link | Separation, Link | Separation]] = []  # (refused, what outweighed it)
        self._joined_by: dict[Atom, Link] = {}  # root -> the strongest link that built its group

    # -- union-find -------------------------------------------------------------------------

    def find(self, atom: Atom) -> Atom:
        parent = self._parent
        if atom not in parent:
            parent[atom] = atom
            return atom
        root = atom
        while parent[root] != root:
            root = parent[root]
        while parent[atom] != root:
            parent[atom], atom = root, parent[atom]
        return root

    def _conflict(self, ra: Atom, rb: Atom) -> Separation | None:
        """The separation that keeps the groups of ``ra`` and ``rb`` apart, if any."""
        apart_a, apart_b = self._apart.get(ra), self._apart.get(rb)
        if not apart_a or not apart_b:
            return None
        small, large = (apart_a, apart_b) if len(apart_a) <= len(apart_b) else (apart_b, apart_a)
        for index in small:
            if index in large:
                return self._separations[index]
        return None

    def _join(self, link: Link) -> None:
        ra, rb = self.find(link.a), self.find(link.b)
        if ra == rb:
            return
        conflict = self._conflict(ra, rb)
        if conflict is not None:
            self.refused.append((link, conflict))
            return
        apart_a, apart_b = self._apart.pop(ra, {}), self._apart.pop(rb, {})
        for index, count in apart_a.items():
            apart_b[index] = apart_b.get(index, 0) + count
        self._parent[ra] = rb
        if apart_b:
            self._apart[rb] = apart_b
        joined = [j for j in (self._joined_by.pop(ra, None), self._joined_by.get(rb), link) if j is not None]
        self._joined_by[rb] = max(joined, key=lambda j: j.strength)

    def _separate(self, separation: Separation) -> None:
        index = len(self._separations)
        self._separations.append(separation)
        groups: dict[Atom, list[Atom]] = {}
        for member in separation.members:
            groups.setdefault(self.find(member), []).append(member)
        for root, members in groups.items():
            if len(members) > 1:  # stronger links already put these together: not apart for them
                self.refused.append((separation, self._joined_by.get(root) or separation))
            apart = self._apart.setdefault(root, {})
            apart[index] = apart.get(index, 0) + len(members)

    def weigh(self, links: Iterable[Link], separations: Iterable[Separation]) -> None:
        """Apply the evidence strongest first: at each level the links, then the separations."""
        links, separations = list(links), list(separations)
        for level in LEVELS:
            for link in links:
                if link.strength == level:
                    self._join(link)
            for separation in separations:
                if separation.strength == level:
                    self._separate(separation)

    # -- reading ----------------------------------------------------------------------------

    def same(self, a: Atom, b: Atom) -> bool:
        return self.find(a) == self.find(b)

    def apart(self, a: Atom, b: Atom) -> Separation | None:
        """What shows ``a`` and ``b`` on different nodes (None: not shown)."""
        ra, rb = self.find(a), self.find(b)
        return None if ra == rb else self._conflict(ra, rb)

    def roots_with(self, tag: str) -> set[Atom]:
        """The groups holding an atom tagged ``tag`` (atoms are ``(tag, value)`` tuples)."""
        return {self.find(a) for a in list(self._parent) if isinstance(a, tuple) and a and a[0] == tag}

    def separation_between(self, atoms: Iterable[Atom]) -> Separation | None:
        """A separation that holds between two of ``atoms``' groups, the strongest one."""
        roots = {self.find(a) for a in atoms}
        seen: dict[int, Atom] = {}
        found: Separation | None = None
        for root in roots:
            for index in self._apart.get(root, {}):
                if index in seen and seen[index] != root:
                    candidate = self._separations[index]
                    if found is None or candidate.strength > found.strength:
                        found = candidate
                seen.setdefault(index, root)
        return found
