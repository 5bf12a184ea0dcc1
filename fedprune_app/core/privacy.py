"""Client-level differential privacy: DP-FedAvg (McMahan et al., 2018) with Flower's helpers and
accountant.

A round of a method that declares a private release (`FederatedStrategy.dp_release`):

- each sampled client k clips its update Δ_k = θ_k − θ to L2 norm C over all released tensors
  jointly, Δ̂_k = Δ_k · min(1, C / ‖Δ_k‖₂) (the paper's per-user clipping, `clip_update`), before it
  replies where the payload allows (`FederatedClient.dp_clips_on_client`), so the server never holds
  an unclipped update;
- the server clips every reply again (a no-op for a clipped one: the guarantee does not rest on the
  clients), and releases θ' = θ + (1/m)·Σ_k Δ̂_k + N(0, (σ·C/m)²·I) with uniform weights and the
  fixed denominator m = the clients sampled for the round (the paper's f̃_f estimator with w_k = 1;
  a dropped reply adds 0 and the noise stays calibrated), `private_mean`;
- the release is one Gaussian mechanism of noise multiplier σ on a sum of sensitivity C
  (add-or-remove-one client); `PrivacyLedger` composes it in Flower's RDP accountant (Google's
  `dp-accounting`) and reports ε at δ after every round; `dp-max-epsilon` refuses a round whose
  release would exceed the budget.

No amplification by sampling is claimed (`SamplingMethod.NO_AMPLIFICATION`, as Flower's own
accounted mode requires): fedprune samples with a seeded RNG whose seed is in the run config, so the
sample is not secret. Central DP: the aggregator is trusted with the clipped updates; Flower's
Message API has no secure aggregation.

The guarantee is judged by what someone holding the run directory can do:

- **Secret noise.** Every release draws its noise from a generator seeded afresh from the OS's
  entropy (`secrets`), never from `seed`, and the generator is kept nowhere (not in the checkpoint,
  not in a log). Flower's `add_gaussian_noise_inplace` is not used for this: it draws from NumPy's
  global RNG, which the run seeds with `seed` (in config.json) and checkpoints. Reproducible noise
  exists only behind `dp-reproducible-noise = true`, and such a run reports ε as void ("not
  private") everywhere ε appears.
- **Every release charged once, before it leaves.** A round is composed in the accountant and the
  ledger written to `<run>/privacy-ledger.json` (atomically) before its model goes to any client;
  a resumed run continues that ledger, not only the checkpoint's, so a round released after the
  last checkpoint stays charged, and re-running it is a new release with fresh noise, charged
  again.

What is Flower's and what is not: the clipping is Flower's helpers
(`flwr.supercore.differential_privacy` in Flower 1.42: `get_norm`, `clip_inputs_inplace`,
`compute_stdv`) and ε is Flower's `RdpAccountant`; the noise is `add_noise` (above). Flower's
strategy wrappers (`DifferentialPrivacy{Client,Server}SideFixedClipping`) are not used: they wrap
Flower's own `start` loop, which `RoundRunner.start` replaces (per-node payloads, retries,
resume), and their accounted mode needs `FedAvg.aggregate_train` (which refuses to run under DP
here). Flower's `fixedclipping_mod` is not used either: a mod wraps every method's ClientApp alike,
while the clipping is per method (LoRA factors at a client's own rank, a recovery method's round-1
statistics are no update of the sent arrays), and it takes C from the message's config rather than
the validated run config."""

from __future__ import annotations

import logging
import math
import secrets
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from fedprune_app.core import registry
from fedprune_app.core.config import ConfigError, DPConfig, RunConfig
from fedprune_app.core.protocol import flat_metrics, numpy_state, to_record
from fedprune_app.core.statefile import write_json_atomically

ACCOUNTANT_SAMPLING = "no-amplification"
LEDGER_FILE = "privacy-ledger.json"  # in the run directory, rewritten at every release
VOID = "not private: dp-reproducible-noise = true (the noise can be recomputed from config.json)"
log = logging.getLogger("flwr")


# --- clipping and noise: Flower's helpers ---------------------------------------------------------


def clip_update(
    local: Mapping[str, np.ndarray],
    reference: Mapping[str, np.ndarray],
    keys: Sequence[str],
    clipping_norm: float,
) -> tuple[dict[str, np.ndarray], float]:
    """(reference + Δ·min(1, C/‖Δ‖₂) over `keys`, other entries of `local` as they are; ‖Δ‖₂ before
    clipping).

    Flower's `clip_inputs_inplace` (FlatClip) on the float64 difference; the result in each tensor's
    dtype."""
    from flwr.supercore.differential_privacy import clip_inputs_inplace, get_norm

    delta = [np.asarray(local[k], np.float64) - np.asarray(reference[k], np.float64) for k in keys]
    norm = get_norm(delta)
    out = dict(local)
    if norm <= clipping_norm:  # untouched, bit for bit
        return out, norm
    clip_inputs_inplace(delta, clipping_norm)
    for k, d in zip(keys, delta, strict=True):
        out[k] = (np.asarray(reference[k], np.float64) + d).astype(np.asarray(local[k]).dtype)
    return out, norm


def noise_generator(dp: DPConfig, seed: int, server_round: int) -> np.random.Generator:
    """The generator of one release's noise: seeded from 128 bits of OS entropy (`secrets`), made
    for this release and kept nowhere; with `dp-reproducible-noise`, from (`seed`, round), which
    anyone with config.json can rebuild (the run reports ε as void)."""
    if dp.dp_reproducible_noise:
        return np.random.default_rng([seed, server_round, 0x6470])  # "dp"
    return np.random.default_rng(secrets.randbits(128))


def add_noise(arrays: Sequence[np.ndarray], std: float, rng: np.random.Generator) -> None:
    """Add N(0, std²) to every entry of the float64 `arrays`, in place, from `rng`."""
    for array in arrays:
        array += rng.normal(0.0, std, size=array.shape)


def private_mean(
    reference: Mapping[str, np.ndarray],
    states: Sequence[Mapping[str, np.ndarray]],
    keys: Sequence[str],
    clipping_norm: float,
    noise_multiplier: float,
    sampled: int,
    rng: np.random.Generator | None = None,
) -> tuple[dict[str, np.ndarray], list[float]]:
    """DP-FedAvg's release over `keys`: θ + (1/m)·Σ_k clip_C(θ_k − θ) + N(0, (σ·C/m)²) with m =
    `sampled` (the clients sampled, ≥ the states given); the pre-clipping norm of every update.
    Noise: std from Flower's `compute_stdv`, drawn from `rng` (`noise_generator`; needed when
    σ > 0) in float64, then each tensor's dtype."""
    from flwr.supercore.differential_privacy import compute_stdv

    if noise_multiplier > 0.0 and rng is None:
        raise ValueError("private_mean: σ > 0 needs the release's noise generator")
    if sampled < len(states) or sampled < 1:
        raise ValueError(f"private_mean: {len(states)} updates from {sampled} sampled clients")
    total = [np.zeros(np.shape(reference[k]), np.float64) for k in keys]
    norms = []
    for state in states:
        clipped, norm = clip_update(state, reference, keys, clipping_norm)
        norms.append(norm)
        for acc, k in zip(total, keys, strict=True):
            acc += np.asarray(clipped[k], np.float64) - np.asarray(reference[k], np.float64)
    mean = [acc / sampled for acc in total]
    if noise_multiplier > 0.0:
        add_noise(mean, compute_stdv(noise_multiplier, clipping_norm, sampled), rng)  # type: ignore[arg-type]
    out = {
        k: (np.asarray(reference[k], np.float64) + d).astype(np.asarray(reference[k]).dtype)
        for k, d in zip(keys, mean, strict=True)
    }
    return out, norms


def float_keys(state: Mapping[str, np.ndarray]) -> list[str]:
    """The floating-point tensors of a state, in its order (masks and integer buffers are not
    updates)."""
    return [k for k, v in state.items() if np.asarray(v).dtype.kind == "f"]


# --- accounting: Flower's RDP accountant ----------------------------------------------------------


class PrivacyLedger:
    """ε at δ of the releases so far, through Flower's `RdpAccountant` (dp-accounting): one
    `GaussianPrivacyEvent(σ, m, N)` per release, no amplification by sampling, add-or-remove-one
    neighbouring clients. With a `path` every release rewrites the ledger file (atomically) as it is
    charged; the checkpoint holds the same state. σ = 0 releases nothing private: ε = ∞ (None); so
    does `dp-reproducible-noise` (void)."""

    def __init__(self, dp: DPConfig, path: Path | None = None) -> None:
        self.dp = dp
        self.path = path  # the run's privacy-ledger.json (None: not written)
        self.accountant: Any = None  # flwr's RdpAccountant, built at the first round (population)
        self.releases = 0  # releases, σ = 0 included
        self.released_rounds: list[int] = []  # the round of each release; a re-release repeats it

    @property
    def void(self) -> bool:
        """The noise can be recomputed from the run config (`dp-reproducible-noise`)."""
        return self.dp.dp_reproducible_noise

    def start(self, population: int) -> None:
        """Build the accountant for a population of `population` clients (kept as is once built or
        restored)."""
        if self.accountant is None and self.dp.dp_noise_multiplier > 0.0:
            self.accountant = rdp_accountant(
                self.dp.dp_delta, max(1, population), self.dp.dp_max_epsilon or None
            )

    def event(self, sampled: int) -> Any:
        """One round's release. Without amplification the accountant uses σ alone; m is recorded
        (capped at the population, which a later resume on more nodes may exceed)."""
        from flwr.serverapp import GaussianPrivacyEvent

        population = self.accountant.config.population_size
        return GaussianPrivacyEvent(
            self.dp.dp_noise_multiplier, min(max(1, sampled), population), population
        )

    def allows(self, sampled: int) -> bool:
        """Whether one more release stays within `dp-max-epsilon` (always, without a budget)."""
        if self.accountant is None or not self.dp.dp_max_epsilon:
            return True
        return not self.accountant.would_exceed(self.event(sampled))

    def compose(self, sampled: int, server_round: int = 0) -> None:
        """Charge one release (of round `server_round`) and write the ledger file, before anything
        computed from the release leaves the server."""
        self.releases += 1
        self.released_rounds.append(server_round)
        if self.accountant is not None:
            self.accountant.compose(self.event(sampled))
        self.save()

    def save(self) -> None:
        """Rewrite the ledger file (atomically), where there is one."""
        if self.path is not None:
            write_json_atomically(self.path, self.state_dict())

    def nominal_epsilon(self) -> float | None:
        """ε at dp-delta the accountant computes (what a budget is checked against), void or not:
        0 before any release, None (infinite) once a round released without noise."""
        if self.releases == 0:
            return 0.0
        if self.accountant is None:
            return None
        return float(self.accountant.get_privacy_spent().epsilon)

    def epsilon(self) -> float | None:
        """ε at dp-delta so far as reported: `nominal_epsilon`, or None (no guarantee) when the
        noise is reproducible."""
        return None if self.void and self.releases else self.nominal_epsilon()

    def planned(self, rounds: int) -> list[float]:
        """ε after each of `rounds` more releases (a scratch copy; without amplification each costs
        the same)."""
        if self.accountant is None or rounds < 1:
            return []
        from flwr.supercore.privacy_accounting.rdp_accountant import RdpAccountant

        scratch = RdpAccountant(self.accountant.config)  # the same config, a copy of the ledger
        scratch.load_state_dict(self.accountant.state_dict())
        out = []
        for _ in range(rounds):
            scratch.compose(self.event(1))
            out.append(float(scratch.get_privacy_spent().epsilon))
        return out

    def state_dict(self) -> dict[str, Any]:
        """The ledger as JSON-able data: the releases so far (and their rounds), σ and δ, and
        Flower's accountant state."""
        return {
            "releases": self.releases,
            "released-rounds": list(self.released_rounds),
            "noise-multiplier": self.dp.dp_noise_multiplier,
            "delta": self.dp.dp_delta,
            "accountant": None if self.accountant is None else self.accountant.state_dict(),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore the ledger; the accountant's config (δ, population, sampling) is the
        checkpoint's."""
        self.releases = int(state["releases"])
        self.released_rounds = [int(r) for r in state.get("released-rounds", [])]
        saved = state.get("accountant")
        if saved is None:
            self.accountant = None
            return
        config = dict(saved["config"])
        self.accountant = rdp_accountant(
            float(config["target_delta"]), int(config["population_size"]), config["max_epsilon"]
        )
        self.accountant.load_state_dict(_plain(saved))  # refuses another relation or sampling


def read_ledger(path: Path) -> dict[str, Any] | None:
    """The ledger file a run wrote (`PrivacyLedger.state_dict` as JSON), None when there is none.
    ConfigError (naming `resume-from`) for one that is not a ledger: a resume must not spend a
    budget it cannot read."""
    import json

    if not path.is_file():
        return None
    try:
        state = json.loads(path.read_text())
        if not isinstance(state, dict) or not isinstance(state.get("releases"), int):
            raise ValueError("no 'releases' count")
    except ValueError as err:
        raise ConfigError(
            f"run-config key 'resume-from': {path} is not a privacy ledger ({err}); the budget "
            "already spent cannot be read"
        ) from err
    return state


def rdp_accountant(delta: float, population: int, max_epsilon: float | None = None) -> Any:
    """Flower's `RdpAccountant` as fedprune accounts: add-or-remove-one client, no amplification."""
    from flwr.serverapp import NeighboringRelation, PrivacyConfig, SamplingMethod
    from flwr.supercore.privacy_accounting.rdp_accountant import RdpAccountant

    return RdpAccountant(
        PrivacyConfig(
            target_delta=delta,
            population_size=population,
            neighboring_relation=NeighboringRelation.ADD_OR_REMOVE_ONE,
            sampling_method=SamplingMethod(ACCOUNTANT_SAMPLING),
            max_epsilon=max_epsilon,
        )
    )


def epsilon_after(noise_multiplier: float, rounds: int, delta: float) -> float:
    """ε at δ after `rounds` releases of noise multiplier σ, as a run reports it (Flower's RDP
    accountant, no amplification by sampling, add-or-remove-one)."""
    from flwr.serverapp import GaussianPrivacyEvent

    accountant = rdp_accountant(delta, 1)
    accountant.compose(GaussianPrivacyEvent(noise_multiplier, 1, 1), rounds)
    return float(accountant.get_epsilon(delta))


def noise_multiplier_for(epsilon: float, rounds: int, delta: float) -> float:
    """The smallest σ (to 0.1%) whose `rounds` releases stay within ε at δ (`epsilon_after`,
    bisection): what `dp-noise-multiplier` to set for a target ε over the planned rounds."""
    lo, hi = 1e-3, 1e4
    if epsilon_after(hi, rounds, delta) > epsilon:
        raise ValueError(
            f"no noise multiplier up to {hi:g} reaches ε = {epsilon:g} at δ = {delta:g}"
        )
    while hi / lo > 1.001:
        mid = math.sqrt(lo * hi)
        lo, hi = (mid, hi) if epsilon_after(mid, rounds, delta) > epsilon else (lo, mid)
    return hi


def _plain(value: Any) -> Any:
    """A decoded checkpoint value as Flower's accountant expects its JSON: tuples as lists."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


# --- the strategy base's half and the refusal -----------------------------------------------------


def check_private(cfg: RunConfig) -> None:
    """With `dp-clipping-norm` > 0, ConfigError (one line naming the method and why) when the
    method's strategy cannot release its aggregate as DP-FedAvg (`dp_refusal`). Called before any
    model loads."""
    if not cfg.section(DPConfig).enabled:
        return
    reason = registry.strategy_class(cfg.method).dp_refusal(cfg)
    if reason:
        raise ConfigError(
            f"run-config key 'dp-clipping-norm' > 0: method '{cfg.method}' cannot run with "
            f"differential privacy: {reason}"
        )


# what a method may override of `PrivateRelease` (a release that is not the plain clipped mean of
# same-shaped updates overrides `dp_aggregate`)
DP_HOOKS = ("dp_refusal", "dp_release_keys", "dp_aggregate")


class PrivateRelease:
    """What `FederatedStrategy` does with `dp-clipping-norm` > 0 (mixed into it). A method opts in
    by saying what a round releases (`dp_release`, in words) and, where not every float tensor of
    the global state is an averaged update, which tensors (`dp_release_keys`); `dp_refusal` says why
    a configuration cannot."""

    # None: the method's aggregate is not a mean of same-shaped updates
    dp_release: ClassVar[str | None] = None
    dp_unsupported: ClassVar[str] = (
        "its aggregate is not a mean of same-shaped client updates"  # why, when None
    )
    cfg: RunConfig
    num_connected: int
    record: Any

    @classmethod
    def dp_refusal(cls, cfg: RunConfig) -> str | None:
        """Why this method (with this config) cannot run as DP-FedAvg; None when it can."""
        return cls.dp_unsupported if cls.dp_release is None else None

    def dp_release_keys(self, server_round: int, reference: Mapping[str, np.ndarray]) -> list[str]:
        """The tensors of the global state whose update is clipped, averaged and noised (default:
        every float tensor); the others come from the method's own `aggregate` of the clipped
        replies."""
        return float_keys(reference)

    @property
    def dp(self) -> DPConfig:
        """The run's DP keys."""
        return self.cfg.section(DPConfig)

    @property
    def privacy(self) -> PrivacyLedger:
        """This strategy's ledger of released rounds (created on first use)."""
        if "_privacy" not in self.__dict__:
            self.__dict__["_privacy"] = PrivacyLedger(self.dp)
        return self.__dict__["_privacy"]

    def keep_ledger(self, run_dir: Path) -> None:
        """Write the ledger to `<run_dir>/privacy-ledger.json` at every release (where DP is on)."""
        if self.dp.enabled:
            self.privacy.path = run_dir / LEDGER_FILE
            if self.privacy.releases:  # a resumed ledger: in the new run directory at once
                self.privacy.save()

    def continue_ledger(self, interrupted: Path, checkpoint_round: int) -> None:
        """On resume, after the checkpoint's state: continue the interrupted run's ledger file
        where it holds more releases than the checkpoint (rounds released after the checkpoint
        was written stay charged); a `privacy` row `carried` says so."""
        if not self.dp.enabled:
            return
        saved = read_ledger(interrupted / LEDGER_FILE)
        at_checkpoint = self.privacy.releases
        if saved is not None and saved["releases"] > at_checkpoint:
            self.privacy.load_state_dict(saved)
        if self.privacy.releases:
            self.record(
                {
                    "round": checkpoint_round,
                    "phase": "privacy",
                    "status": "carried",
                    "dp-releases": self.privacy.releases,
                    "dp-beyond-checkpoint": self.privacy.releases - at_checkpoint,
                    "dp-epsilon": self.privacy.epsilon(),
                }
            )

    def dp_noise(self, server_round: int) -> np.random.Generator:
        """The noise generator of this round's release (`noise_generator`: fresh OS entropy)."""
        return noise_generator(self.dp, self.cfg.seed, server_round)

    def dp_state(self) -> dict[str, Any]:
        """What a checkpoint keeps of DP: the ledger, where DP is on."""
        return {"privacy": self.privacy.state_dict()} if self.dp.enabled else {}

    def load_dp_state(self, state: Mapping[str, Any]) -> None:
        """Continue the checkpointed ledger, so a resumed run spends the same budget."""
        if self.dp.enabled and "privacy" in state:
            self.privacy.load_state_dict(state["privacy"])

    def dp_allows(self, server_round: int, num_rounds: int) -> bool:
        """Before round `server_round`: whether its release fits `dp-max-epsilon`. The first time, a
        `privacy` row `planned` (ε after the planned rounds, rounds the budget allows); a refused
        round, a row `budget-exhausted`, the log line, and `dp_last_round` = the round whose models
        are final."""
        if not self.dp.enabled:
            return True
        ledger = self.privacy
        fresh = ledger.accountant is None and ledger.releases == 0
        ledger.start(self.num_connected)
        if fresh and ledger.accountant is not None:
            plan = ledger.planned(num_rounds - server_round + 1)
            budget = self.dp.dp_max_epsilon
            allowed = sum(1 for eps in plan if not budget or eps <= budget)
            self.record(
                {
                    "round": server_round - 1,
                    "phase": "privacy",
                    "status": "planned",
                    "dp-planned-epsilon": plan[-1] if plan else 0.0,
                    "dp-allowed-rounds": allowed,
                    "dp-delta": self.dp.dp_delta,
                    "dp-max-epsilon": budget,
                    **({"dp-void": VOID} if ledger.void else {}),
                }
            )
            log.info(
                "[fedprune] DP: ε after %d planned rounds = %.3f at δ = %g%s%s",
                len(plan),
                plan[-1] if plan else 0.0,
                self.dp.dp_delta,
                f"; dp-max-epsilon = {budget:g} allows {allowed}" if budget else "",
                f"; ε is void, {VOID}" if ledger.void else "",
            )
        if ledger.allows(self.num_connected):
            return True
        spent, nxt = ledger.nominal_epsilon() or 0.0, ledger.planned(1)[0]
        self.record(
            {
                "round": server_round,
                "phase": "privacy",
                "status": "budget-exhausted",
                "dp-epsilon": spent,
                "dp-epsilon-next": nxt,
                "dp-delta": self.dp.dp_delta,
                "dp-max-epsilon": self.dp.dp_max_epsilon,
            }
        )
        log.warning(
            "[fedprune] DP: round %d not started: ε would reach %.3f > dp-max-epsilon = %g "
            "(spent %.3f); the run ends with the models of round %d",
            server_round,
            nxt,
            self.dp.dp_max_epsilon,
            spent,
            server_round - 1,
        )
        self.__dict__["dp_last_round"] = server_round - 1
        return False

    def dp_aggregate(self, server_round: int, replies: list[Any], arrays: Any, sampled: int) -> Any:
        """DP-FedAvg's release of one round: `private_mean` over `dp_release_keys` with the fixed
        denominator m = `sampled` and fresh noise; every other tensor the global state's as it was
        (nothing from a client enters the release unclipped and un-noised). The method's
        `aggregate` still sees the clipped replies for its bookkeeping (its arrays are dropped).
        The round is charged and its `privacy` row logged (ε at δ, σ, C, m, replies, noise std,
        how many updates clipping shrank) before the release is returned."""
        from flwr.app import RecordDict

        dp = self.dp
        reference = numpy_state(arrays)
        keys = self.dp_release_keys(server_round, reference)
        states = [numpy_state(r.array_records["arrays"]) for r in replies]
        clipped: list[Any] = []
        for reply, state in zip(replies, states, strict=True):
            copy = RecordDict(dict(reply.items()))
            copy["arrays"] = to_record(clip_update(state, reference, keys, dp.dp_clipping_norm)[0])
            clipped.append(copy)
        if clipped:  # the method's bookkeeping (e.g. histories from metrics); arrays not released
            self.aggregate(server_round, clipped)  # type: ignore[attr-defined]
        released, norms = private_mean(
            reference,
            states,
            keys,
            dp.dp_clipping_norm,
            dp.dp_noise_multiplier,
            sampled,
            self.dp_noise(server_round) if dp.dp_noise_multiplier > 0 else None,
        )
        self.dp_account(server_round, sampled, replies, norms)
        return to_record(reference | released)

    def dp_account(
        self, server_round: int, sampled: int, replies: list[Any], norms: list[float]
    ) -> None:
        """A released round: composed in the accountant; its `privacy` row (ε at δ, σ, C, m,
        replies, noise std, updates clipping shrank, here or on the client), its log line."""
        from flwr.supercore.differential_privacy import compute_stdv

        dp = self.dp
        shrunk = sum(
            1
            for r, n in zip(replies, norms, strict=True)
            if n > dp.dp_clipping_norm * (1 + 1e-6) or flat_metrics(r).get("dp-clipped") == 1
        )
        self.privacy.compose(sampled, server_round)  # charged (and written) before it leaves
        eps = self.privacy.epsilon()
        std = compute_stdv(dp.dp_noise_multiplier, dp.dp_clipping_norm, sampled)
        self.record(
            {
                "round": server_round,
                "phase": "privacy",
                "status": "released",
                "dp-epsilon": eps,
                "dp-delta": dp.dp_delta,
                "dp-noise-multiplier": dp.dp_noise_multiplier,
                "dp-clipping-norm": dp.dp_clipping_norm,
                "dp-sampled": sampled,
                "dp-replies": len(replies),
                "dp-noise-std": std,
                "dp-clipped": shrunk,
                **({"dp-void": VOID} if self.privacy.void else {}),
            }
        )
        log.info(
            "[fedprune] DP round %d: %d replies of %d sampled clients clipped to C = %g (%d "
            "shrunk), noise std %.3g; ε = %s at δ = %g",
            server_round,
            len(replies),
            sampled,
            dp.dp_clipping_norm,
            shrunk,
            std,
            "void (dp-reproducible-noise)"
            if self.privacy.void
            else "∞"
            if eps is None
            else f"{eps:.3f}",
            dp.dp_delta,
        )

    def privacy_summary(self) -> dict[str, Any]:
        """summary.json's `privacy`: ε at δ after the released rounds, and the round a budget stop
        ended at."""
        if not self.dp.enabled:
            return {}
        return {
            "epsilon": self.privacy.epsilon(),
            **({"void": VOID} if self.privacy.void else {}),
            "delta": self.dp.dp_delta,
            "noise-multiplier": self.dp.dp_noise_multiplier,
            "clipping-norm": self.dp.dp_clipping_norm,
            "rounds-released": self.privacy.releases,
            "released-rounds": list(self.privacy.released_rounds),
            "stopped-after-round": self.__dict__.get("dp_last_round"),
        }
