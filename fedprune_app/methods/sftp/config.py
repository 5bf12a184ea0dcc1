"""SFT-P's run-config keys (Table 4 of the paper unless a key says otherwise); its budgets and held
coordinates are the masked bus's (`fedprune_app.structural.config.BusConfig`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from fedprune_app.core.config import ConfigError, ConfigSection, RunConfig, key, split_list
from fedprune_app.structural.config import BusConfig


@dataclass(frozen=True)
class SFTPConfig(ConfigSection):
    """SFT-P: budgets, gates, generator, adapters."""

    title: ClassVar[str] = "SFT-P"

    sftp_conditioning: bool = key(
        True,
        "SFT-P client conditioning (+C): the generator reads the client's private "
        "embedding e_k; false = NOC (one shared fixed input, the same masks for every client).",
    )
    sftp_adapters: bool = key(
        True,
        "SFT-P adapter co-training (+A): LoRA (lora-* keys) trained and federated with the "
        "generator; false = NOA.",
    )
    sftp_loss_on: str = key(
        "sequence",
        "What L_CLM of Eq. 13 is computed on: 'sequence' = every token of prompt + response (§3.3: "
        "'the standard causal language modeling loss on client k's local corpus (next-token "
        "prediction)'); 'answer' = the response only (FedIT's instruction-tuning labels).",
        choices=("sequence", "answer"),
    )
    sftp_lambda: float = key(16.0, "SFT-P budget regulariser weight lambda (Eq. 13).", minimum=0.0)
    sftp_gate_bias: float = key(
        3.0, "SFT-P gate bias c in pi0 = sigmoid(s + c) (Eq. 12).", minimum=-20.0, maximum=20.0
    )
    sftp_deploy_mask: str = key(
        "budget",
        "SFT-P deployed mask (evaluation and the compiled models): 'budget' = the gates in "
        "descending pi = sigmoid(s + c) that fit the client's budget p (held gates first; kept "
        "ratio = p to one coordinate); 'threshold' = 1[pi > 0.5], whose kept ratio can miss p by "
        "the gates not yet saturated.",
        choices=("budget", "threshold"),
    )
    sftp_deploy_state: str = key(
        "global",
        "SFT-P: whose (Theta, Phi) each client deploys (its evaluation and compiled model), always "
        "with its own e_k. 'global' = the last round's FedAvg (Eq. 15); 'local' = the client's own "
        "(Theta_k, Phi_k) after its last local steps (the pair it uploads then, the one its e_k "
        "was last trained with; an earlier round's if it was not sampled in the last). Alg. 1 ends "
        "with the server's aggregate and does not say which a client deploys.",
        choices=("global", "local"),
    )
    sftp_gate_tau: float = key(
        0.4,
        "SFT-P ReinMax temperature tau (Eq. 12; the reference implementation wants >= 1, the "
        "paper uses 0.4).",
        minimum=1e-3,
    )
    sftp_embed_dim: int = key(
        16,
        "SFT-P dimension of the private client embedding e_k (and the layer embedding).",
        minimum=1,
    )
    sftp_embed_init_std: float = key(
        1.0,
        "SFT-P standard deviation of e_k's first draw, e_k^(0) ~ N(0, std^2 I) (the paper leaves "
        "it open); 0 starts +C exactly as NOC, and e_k then grows from the client's own gradient.",
        minimum=0.0,
    )
    sftp_embed_lr_scale: float = key(
        1.0,
        "SFT-P learning rate of e_k as a multiple of sftp-generator-lr (the paper trains e_k with "
        "the generator: 1); below 1, e_k moves slower than Θ. At a fast generator rate e_k's size "
        "(sftp-embed-init-std) sets how fast +C cuts more than e_k's rate does "
        "(docs/methods/sftp.md).",
        minimum=0.0,
    )
    sftp_generator_hidden: int = key(
        32, "SFT-P hidden units of the 2-layer MLP mask generator.", minimum=1
    )
    sftp_generator_lr: float = key(
        1e-3, "SFT-P AdamW learning rate of the generator and e_k (no schedule).", minimum=0.0
    )
    sftp_generator_weight_decay: float = key(
        0.05, "SFT-P AdamW weight decay of the generator Θ.", minimum=0.0
    )
    sftp_embed_weight_decay: float = key(
        0.05,
        "SFT-P AdamW weight decay of the private embedding e_k. Table 4 lists 'Weight decay 0.05 "
        "(mask generator)' and the learning rate 'for (Θ, e_k)': whether e_k decays is open; 0.05 "
        "(e_k decays with Θ) is how every "
        "recorded run trained; 0 did not change the mixed-budget failure (docs/methods/sftp.md, "
        '"Giving e_k more room").',
        minimum=0.0,
    )
    sftp_lora_lr: float = key(
        2e-5,
        "SFT-P LoRA learning rate (cosine-annealed over all rounds' local steps).",
        minimum=0.0,
    )
    sftp_recovery_rounds: int = key(
        0,
        "SFT-P: the last this many rounds train Phi only, on each client's deployed mask held "
        "fixed (Theta and e_k frozen, no budget penalty): a recovery stage on the structure that "
        "is compiled, as LLM-Pruner and SliceGPT get; not in the paper's Alg. 1 (0 = the paper). "
        "Needs sftp-adapters and fewer than num-server-rounds.",
        minimum=0,
    )
    sftp_budget_warmup_steps: int = key(
        0,
        "SFT-P: the budget target of Eq. 13 falls linearly from 1 to p over this many local steps "
        "counted across rounds ((round-1) x local-steps + t), then stays at p: a target warm-up as "
        "in Sheared-LLaMA's pruning stage, so the gates close as fast as the LM loss can choose; "
        "not in the paper (0 = the paper's constant p). At most (num-server-rounds - "
        "sftp-recovery-rounds) x local-steps.",
        minimum=0,
    )
    sftp_budget_warmup_start: str = key(
        "one",
        "SFT-P, with sftp-budget-warmup-steps > 0: where each client's ramped target starts. "
        "'one': at 1, so clients of different budgets p_k start level and part only as the ramp "
        "goes; 'gap': at 1 - (max_j p_j - p_k), i.e. every target is shifted by the same (1 - max "
        "p)(1 - r_t), so the clients keep their budgets' gaps from the first step. Equal budgets: "
        "the two are the same ramp.",
        choices=("one", "gap"),
    )
    sftp_aggregation: str = key(
        "equal",
        "SFT-P FedAvg weights of Theta and Phi (Eq. 15): equal per client (Table 4) or by the "
        "clients' num-examples.",
        choices=("equal", "num-examples"),
    )
    sftp_speed_prefill: int = key(
        512,
        "SFT-P: after the run, time each client's compiled model against the dense "
        "one (prefill of this many tokens, batch 1, and 32 greedy tokens; medians of 3), each "
        "speed-up beside its FLOP ceiling, for results.md's 'Compiled models' table; 0 "
        "= sizes only.",
        minimum=0,
    )

    # The shortest schedules known to deploy working models on the embedded default: (keep ratio,
    # total local steps per client) of conf/sftp.toml (6 rounds x 25 steps at 0.8) and
    # conf/sftp-50.toml (12 x 50 at 0.5).
    KNOWN_SCHEDULES: ClassVar[tuple[tuple[float, int], ...]] = ((0.8, 150), (0.5, 600))

    def advice(self, cfg: RunConfig) -> list[str]:
        """SFT-P cut before the model could adapt: fewer local steps than the working presets at
        this budget."""
        bus = cfg.section(BusConfig)
        if cfg.method != "sftp" or bus.hold_open == "all":
            return []
        keep = min(float(v) for v in split_list(bus.keep_ratios))
        steps = cfg.num_server_rounds * cfg.local_steps
        need = next((n for p, n in self.KNOWN_SCHEDULES if keep >= p), self.KNOWN_SCHEDULES[-1][1])
        if steps >= need:
            return []
        known = "; ".join(f"keep {p:g}: {n}" for p, n in self.KNOWN_SCHEDULES)
        return [
            f"keep-ratios {keep:g} with num-server-rounds x local-steps = "
            f"{cfg.num_server_rounds} x {cfg.local_steps} = {steps} local steps: the schedules "
            f"known to deploy working models train at least {need} ({known}; conf/sftp.toml, "
            "conf/sftp-50.toml). With fewer, the masks cut the model before it adapts and the "
            "deployed models are likely broken (docs/methods/sftp.md)."
        ]

    def check(self, cfg: RunConfig) -> None:
        if self.sftp_recovery_rounds and not self.sftp_adapters:
            raise ConfigError(
                "run-config key 'sftp-recovery-rounds' trains Phi only: it needs sftp-adapters = "
                f"true (got sftp-recovery-rounds = {self.sftp_recovery_rounds}, "
                "sftp-adapters = false)"
            )
        if self.sftp_recovery_rounds >= cfg.num_server_rounds:
            raise ConfigError(
                f"run-config key 'sftp-recovery-rounds' must be below num-server-rounds "
                f"({cfg.num_server_rounds}) so that the masks train first, "
                f"got {self.sftp_recovery_rounds}"
            )
        trained = (cfg.num_server_rounds - self.sftp_recovery_rounds) * cfg.local_steps
        if self.sftp_budget_warmup_steps > trained:
            raise ConfigError(
                f"run-config key 'sftp-budget-warmup-steps' must be at most (num-server-rounds - "
                f"sftp-recovery-rounds) x local-steps = {trained} so that the masks train at the "
                f"budget p before the run ends, got {self.sftp_budget_warmup_steps}"
            )
