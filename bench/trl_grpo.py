"""TRL's GRPOTrainer on a StreamRL task, for bench/peer_trl.py. Runs inside its own
virtual environment (TRL pins its own dependencies), so it imports nothing of StreamRL.

    python trl_grpo.py CONFIG.json  -> prints a JSON object as its last line
"""

import json
import os
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
from datasets import Dataset  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback  # noqa: E402
from trl import GRPOConfig, GRPOTrainer  # noqa: E402


def main() -> None:
    cfg = json.load(open(sys.argv[1]))
    torch.set_num_threads(cfg["threads"])
    tok = AutoTokenizer.from_pretrained(cfg["model_dir"])
    model = AutoModelForCausalLM.from_pretrained(cfg["model_dir"], dtype=torch.float32)
    rows = [json.loads(line) for line in open(cfg["prompts"])]
    # The built-in model was warm-started with BOS before the prompt, as StreamRL sends it.
    dataset = Dataset.from_list([{"prompt": tok.bos_token + r["prompt"], "answer": r["answer"]} for r in rows])

    def exact_match(completions, answer, **_):
        return [1.0 if c.strip() == a.strip() else 0.0 for c, a in zip(completions, answer)]

    g = cfg["group_size"]
    args = GRPOConfig(
        output_dir=cfg["out"], per_device_train_batch_size=cfg["micro_batch_size"],
        gradient_accumulation_steps=cfg["prompts_per_step"] * g // cfg["micro_batch_size"],
        num_generations=g, max_completion_length=cfg["max_new_tokens"], learning_rate=cfg["learning_rate"],
        max_steps=cfg["iterations"], temperature=1.0, beta=0.0, loss_type="dr_grpo", logging_steps=1,
        report_to="none", save_strategy="no", seed=cfg["seed"], use_cpu=True, bf16=False,
        dataloader_num_workers=0, disable_tqdm=True,
    )
    rewards = []

    class Rewards(TrainerCallback):
        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs and "reward" in logs:
                rewards.append(logs["reward"])

    trainer = GRPOTrainer(model=model, processing_class=tok, reward_funcs=exact_match, args=args,
                          train_dataset=dataset, callbacks=[Rewards()])
    t0 = time.perf_counter()
    trainer.train()
    wall = time.perf_counter() - t0
    samples = cfg["iterations"] * cfg["prompts_per_step"] * g
    print(json.dumps({"samples": samples, "wall_s": wall, "samples_per_s": samples / wall, "rewards": rewards}))


if __name__ == "__main__":
    main()
