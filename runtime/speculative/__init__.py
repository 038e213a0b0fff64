"""Speculative decoding: propose several tokens cheaply, verify them in one step.

A proposer guesses the next tokens: ``PromptLookup`` finds the text's end earlier in
the prompt or the reply and takes what followed it there (free), and learns the edits
the text makes to what it copies (a renamed variable); ``DraftModel`` runs a small
model of the same vocabulary. The main model then decodes the pending token
and the k guesses in one batch, and the request's own sampler chain samples position
by position, accepting while the sample equals the guess (``verify``). With a
deterministic proposer that draws what decoding without speculation draws, one sample
per emitted token, up to the rounding of the batch shapes (on a CPU llama.cpp computes
a token decoded in a batch slightly differently from one decoded alone).

A verification batch is not free (on a 2-core CPU a batch of 2 tokens costs about two
single steps, one of 5 about three), so the draft length is chosen per step from the
cost of a batch of n tokens on this model and device (``CostModel``, from a profile
measured once: ``Speculator``) and from how often guesses backed by the same kind of
evidence were right (``Acceptance``). When no length is expected to pay, nothing is
proposed and the step is a plain decode.
"""

from infer.runtime.speculative.acceptance import Acceptance
from infer.runtime.speculative.bench import follow
from infer.runtime.speculative.costs import CostModel, measure_batches
from infer.runtime.speculative.draft import DraftModel, DraftSession, check_compatible
from infer.runtime.speculative.lookup import PromptLookup
from infer.runtime.speculative.params import SPEC_TYPES, SpecParams
from infer.runtime.speculative.policy import MARGIN, Speculator, best_length
from infer.runtime.speculative.proposal import Proposal, Proposer
from infer.runtime.speculative.verify import verify

__all__ = [
    "MARGIN",
    "SPEC_TYPES",
    "Acceptance",
    "CostModel",
    "DraftModel",
    "DraftSession",
    "PromptLookup",
    "Proposal",
    "Proposer",
    "SpecParams",
    "Speculator",
    "best_length",
    "check_compatible",
    "follow",
    "measure_batches",
    "verify",
]
