"""What an endpoint's tokens cost: ``Price`` per 1,000 tokens, kept in billionths (``NANO``)."""

from __future__ import annotations

from pydantic import ConfigDict, Field

from evalq.shared.core.strict import Strict


# Cost is kept in billionths of the prices' currency unit: integer sums, exact in every total.
NANO = 10**9


class Price(Strict):
    """What an endpoint's tokens cost per 1,000, in the prices' own currency."""

    model_config = ConfigDict(strict=True)  # a price is a number, never the string "0.01"

    input_per_1k: float = Field(ge=0, allow_inf_nan=False, description="price of 1,000 prompt tokens")
    output_per_1k: float = Field(ge=0, allow_inf_nan=False, description="price of 1,000 completion tokens")
    # For a Batch API mode (not yet used): a provider's batch price, when not half the above.
    batch_input_per_1k: float | None = Field(default=None, ge=0, allow_inf_nan=False,
                                             description="Batch API price of 1,000 prompt tokens (default: half)")
    batch_output_per_1k: float | None = Field(default=None, ge=0, allow_inf_nan=False,
                                              description="Batch API price of 1,000 completion tokens "
                                              "(default: half)")

    def batch(self) -> "Price":
        """The prices of a Batch API call (half the synchronous ones unless given)."""
        inp = self.batch_input_per_1k if self.batch_input_per_1k is not None else self.input_per_1k / 2
        out = self.batch_output_per_1k if self.batch_output_per_1k is not None else self.output_per_1k / 2
        return Price(input_per_1k=inp, output_per_1k=out)

    def cost_nano(self, prompt_tokens: int, completion_tokens: int) -> int:
        """A call's cost in billionths: prompt and completion tokens times their prices."""
        return round((prompt_tokens * self.input_per_1k + completion_tokens * self.output_per_1k) * NANO / 1000)
