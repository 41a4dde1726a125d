"""Reinforcement learning: advantage actor-critic on gymnasium's CartPole-v1, for Gavel's A3C job.

Gavel's A3C plays Atari Pong with 32 asynchronous (Hogwild) workers, 20-step rollouts and Adam at
1e-4. Here the 32 actors step in lockstep in one process (the synchronous variant, A2C, with the
same loss: n-step returns bootstrapped from the critic, an entropy bonus, clipped gradients), so a
step is deterministic and resumable; and the environment is CartPole, which a CPU simulates in
microseconds (no Atari ROMs are needed). Every step is one rollout: 20 moves of each actor with
the current policy, then one update.

The data stream is the actors' experience: its state is the environments themselves (each
CartPole's physical state, its random generator, its episode's length) and the generator that
samples actions, all checkpointed, so a resumed job sees the episodes it would have seen.
``--data-dir`` does not apply (the environment is the data).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from worker_service.workloads.config import WorkloadConfig
from worker_service.workloads.data import ACTIONS, ENVIRONMENT, Batches, generator, position_seed
from worker_service.workloads.errors import DataDirError
from worker_service.workloads.job import TrainingJob, seeded_module

ENV_ID = "CartPole-v1"
ROLLOUT_STEPS = 20  # moves per actor per update (Gavel's --num-steps)
GAMMA = 0.99
ENTROPY_WEIGHT = 0.01
VALUE_WEIGHT = 0.5
CLIP_NORM = 40.0
ROLLOUTS_PER_EPOCH = 1000  # RL has no epochs; this only paces the stream's bookkeeping


@dataclass(frozen=True)
class ActorCriticShape:
    hidden: int


SHAPES = {"small": ActorCriticShape(hidden=64), "full": ActorCriticShape(hidden=256)}


@dataclass(frozen=True)
class Rollout:
    observations: Tensor  # (T, actors, observation dims), what each action was chosen on
    actions: Tensor  # (T, actors)
    rewards: Tensor  # (T, actors)
    episode_ends: Tensor  # (T, actors), 1.0 where the move ended an episode (no bootstrap across it)
    next_observations: Tensor  # (actors, observation dims), where the critic bootstraps from


class ActorCritic(nn.Module):
    def __init__(self, observation_dims: int, actions: int, hidden: int) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(observation_dims, hidden), nn.Tanh(), nn.Linear(hidden, hidden), nn.Tanh())
        self.policy = nn.Linear(hidden, actions)
        self.value = nn.Linear(hidden, 1)

    def forward(self, observations: Tensor) -> tuple[Tensor, Tensor]:
        """(N, observation dims) -> (N, actions) action logits and (N,) state values."""
        features = self.body(observations)
        return self.policy(features), self.value(features).squeeze(-1)


class Rollouts(Batches[Rollout]):
    """Each batch: ``ROLLOUT_STEPS`` moves of every actor, acting with ``policy`` as it is now."""

    def __init__(self, policy: nn.Module, actors: int, seed: int, device: torch.device) -> None:
        super().__init__(ROLLOUTS_PER_EPOCH)
        self.policy, self.device = policy, device
        # The bare environment: the time limit is kept here, where it can be checkpointed.
        self.envs = [gym.make(ENV_ID).unwrapped for _ in range(actors)]
        max_steps = gym.spec(ENV_ID).max_episode_steps
        assert max_steps is not None
        self.max_episode_steps: int = max_steps
        for actor, env in enumerate(self.envs):
            env.reset(seed=position_seed(seed, ENVIRONMENT, actor))
        self.episode_steps = [0] * actors
        self.action_generator = generator(seed, ACTIONS)

    def _observations(self) -> Tensor:
        return torch.from_numpy(np.stack([np.asarray(env.state, dtype=np.float32) for env in self.envs]))

    def make(self, epoch: int, index: int) -> Rollout:  # noqa: ARG002 (experience depends on the environments)
        observations, actions, rewards, ends = [], [], [], []
        current = self._observations()
        for _ in range(ROLLOUT_STEPS):
            with torch.no_grad():
                logits, _ = self.policy(current.to(self.device))
            chosen = torch.multinomial(logits.softmax(-1).cpu(), 1, generator=self.action_generator).squeeze(1)
            step_rewards, step_ends = [], []
            for actor, env in enumerate(self.envs):
                _, reward, terminated, _, _ = env.step(int(chosen[actor]))
                self.episode_steps[actor] += 1
                # A time limit ends the episode like a fall (A3C's convention; no bootstrap across it).
                ended = terminated or self.episode_steps[actor] >= self.max_episode_steps
                if ended:
                    env.reset()
                    self.episode_steps[actor] = 0
                step_rewards.append(float(reward))
                step_ends.append(1.0 if ended else 0.0)
            observations.append(current)
            actions.append(chosen)
            rewards.append(torch.tensor(step_rewards))
            ends.append(torch.tensor(step_ends))
            current = self._observations()
        return Rollout(torch.stack(observations), torch.stack(actions), torch.stack(rewards), torch.stack(ends), current)

    def state_dict(self) -> dict[str, Any]:
        return {
            **super().state_dict(),
            "envs": [
                {
                    "state": [float(v) for v in env.state],
                    "steps_beyond_terminated": env.steps_beyond_terminated,
                    "rng": env.np_random.bit_generator.state,
                }
                for env in self.envs
            ],
            "episode_steps": list(self.episode_steps),
            "action_generator": self.action_generator.get_state(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        for env, saved in zip(self.envs, state["envs"], strict=True):
            env.state = np.array(saved["state"], dtype=np.float64)
            env.steps_beyond_terminated = saved["steps_beyond_terminated"]
            env.np_random.bit_generator.state = saved["rng"]
        self.episode_steps = [int(n) for n in state["episode_steps"]]
        self.action_generator.set_state(state["action_generator"].cpu())


class ActorCriticJob(TrainingJob):
    data: Rollouts

    def step(self, batch: Rollout) -> float:
        observations, actions, rewards, ends, following = (
            t.to(self.device, non_blocking=True)
            for t in (batch.observations, batch.actions, batch.rewards, batch.episode_ends, batch.next_observations)
        )
        steps, actors = actions.shape
        logits, values = self.nets["model"](observations.flatten(0, 1))
        with torch.no_grad():
            _, bootstrap = self.model(following)
        returns = torch.empty_like(rewards)
        running = bootstrap
        for t in reversed(range(steps)):
            running = rewards[t] + GAMMA * running * (1.0 - ends[t])
            returns[t] = running
        advantages = returns.flatten() - values
        log_probs = logits.log_softmax(-1)
        chosen = log_probs.gather(1, actions.flatten().unsqueeze(1)).squeeze(1)
        entropy = -(log_probs.exp() * log_probs).sum(-1).mean()
        loss = -(chosen * advantages.detach()).mean() + VALUE_WEIGHT * advantages.pow(2).mean() - ENTROPY_WEIGHT * entropy
        optimizer = self.optimizers["adam"]
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        nn.utils.clip_grad_norm_(self.model.parameters(), CLIP_NORM)
        optimizer.step()
        return loss.item()


def build(batch_size: int, config: WorkloadConfig) -> ActorCriticJob:
    """``batch_size``: the number of actors (Gavel's 32 workers)."""
    if config.data_dir is not None:
        raise DataDirError(f"A3C takes no --data-dir: it learns from its {ENV_ID} environments")
    shape = SHAPES[config.size]
    probe = gym.make(ENV_ID)
    observation_dims, actions = probe.observation_space.shape[0], probe.action_space.n  # type: ignore[index,attr-defined]
    probe.close()
    model = seeded_module(config.seed, lambda: ActorCritic(observation_dims, int(actions), shape.hidden)).to(config.device)
    data = Rollouts(model, batch_size, config.sample_seed, torch.device(config.device))
    # Adam with AMSGrad, as Gavel's shared optimizer; a larger step than Pong's 1e-4 suits CartPole.
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3, amsgrad=True)
    return ActorCriticJob(family="A3C", batch_size=batch_size, config=config, model=model, optimizers={"adam": optimizer}, data=data)
