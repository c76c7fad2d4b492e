"""Chat prompts for a real model: a fixed list of questions, a seeded choice of them rendered with the model's
own chat template, and output lengths of two kinds (`lengths`):

- `eos`: each answer ends where the model ends it (its EOS), capped at `max_output`: real lengths;
- `fixed`: each answer is exactly `max_output` tokens (EOS ignored), so every system produces the same work.
"""

from __future__ import annotations

import random
from typing import Literal

from benchmarks.workload import Job

Lengths = Literal["eos", "fixed"]
LENGTHS: tuple[Lengths, ...] = ("eos", "fixed")

# Short, varied questions such as a small instruction-tuned model is asked: facts, how-tos, definitions,
# small writing tasks. Their answers run from a sentence to a few paragraphs.
QUESTIONS: tuple[str, ...] = (
    "What is the capital of France?",
    "Explain photosynthesis in two sentences.",
    "Write a haiku about autumn leaves.",
    "What are the three states of matter?",
    "How do I boil an egg?",
    "Give me three tips for a job interview.",
    "What is the difference between weather and climate?",
    "Summarize the story of Cinderella.",
    "Why is the sky blue?",
    "List five fruits that are high in vitamin C.",
    "How does a bicycle stay upright?",
    "What is a prime number? Give two examples.",
    "Write a short thank-you note to a teacher.",
    "What causes the seasons on Earth?",
    "How many continents are there, and what are they?",
    "Explain what a computer program is to a child.",
    "What is the boiling point of water at sea level?",
    "Suggest a name for a friendly robot.",
    "How do plants get water from the soil?",
    "What is the largest ocean on Earth?",
    "Describe a rainbow in one paragraph.",
    "What are some ways to save energy at home?",
    "Who wrote Romeo and Juliet?",
    "How do you make a cup of tea?",
    "What is gravity?",
    "Give me a simple recipe for pancakes.",
    "What does a doctor do?",
    "Why do we need sleep?",
    "Write two sentences about the moon.",
    "What is the difference between a frog and a toad?",
    "How can I improve my handwriting?",
    "What is the water cycle?",
    "Name three musical instruments and how they make sound.",
    "What are the benefits of reading books?",
    "How does a refrigerator keep food cold?",
    "Tell me a fun fact about octopuses.",
    "What is the tallest mountain in the world?",
    "How do I write a good email subject line?",
    "What is recycling and why is it important?",
    "Explain the rules of tic-tac-toe.",
    "What is an atom made of?",
    "Write a limerick about a cat.",
    "What should I pack for a day at the beach?",
    "How do bees make honey?",
    "What is the difference between a virus and a bacterium?",
    "Describe the city of Paris in three sentences.",
    "How does the heart pump blood?",
    "What are good habits for studying?",
)


def chat_jobs(tokenizer, num_requests: int, max_output: int, lengths: Lengths, seed: int = 0) -> list[Job]:
    """`num_requests` questions, drawn in a seeded order (each question once before any repeats), each one
    user turn rendered with the tokenizer's chat template and its generation prompt."""
    from engine.tokenizer import encode_chat

    if lengths not in LENGTHS:
        raise ValueError(f"lengths must be one of {', '.join(LENGTHS)}, got {lengths!r}")
    if max_output < 1:
        raise ValueError(f"max_output must be at least 1, got {max_output}")
    rng = random.Random(seed)
    order: list[str] = []
    while len(order) < num_requests:
        round_ = list(QUESTIONS)
        rng.shuffle(round_)
        order += round_
    return [
        Job(
            prompt_token_ids=encode_chat(tokenizer, [{"role": "user", "content": q}]),
            max_tokens=max_output,
            ignore_eos=lengths == "fixed",
        )
        for q in order[:num_requests]
    ]
