// Stream a chat completion from `conveyor serve` with the `openai` npm package, unchanged.
// Usage: OPENAI_BASE_URL=http://127.0.0.1:8000/v1 OPENAI_API_KEY=... MODEL=tiny node chat.js "Hello" 12
const OpenAI = require("openai");

async function main() {
  const [prompt = "Hello", maxTokens = "16"] = process.argv.slice(2);
  const client = new OpenAI({
    baseURL: process.env.OPENAI_BASE_URL || "http://127.0.0.1:8000/v1",
    apiKey: process.env.OPENAI_API_KEY || "none",
    maxRetries: 0,
  });
  const stream = await client.chat.completions.create({
    model: process.env.MODEL || "tiny",
    messages: [{ role: "user", content: prompt }],
    max_tokens: Number(maxTokens),
    temperature: 0,
    stream: true,
    stream_options: { include_usage: true },
  });
  let finish = null;
  let usage = null;
  for await (const chunk of stream) {
    for (const choice of chunk.choices) {
      process.stdout.write(choice.delta.content || "");
      finish = choice.finish_reason || finish;
    }
    usage = chunk.usage || usage;
  }
  process.stdout.write(`\n[done: ${finish}, ${usage.completion_tokens} tokens]\n`);
}

main().catch((err) => {
  console.error(err);
  process.exit(1);
});
