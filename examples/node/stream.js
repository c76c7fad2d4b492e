// Enqueue one Conveyor job and print its tokens as they arrive (protocol v1, docs/protocol.md).
//   REDIS_URL=redis://localhost:6379/0 node stream.js "Once upon a time" [max_tokens]
// The output stream is read from its start ("0"), so nothing is missed even if the worker is faster.
"use strict";
const Redis = require("ioredis");
const crypto = require("crypto");

async function main() {
  const url = process.env.REDIS_URL || "redis://localhost:6379/0";
  const prefix = process.env.CONVEYOR_PREFIX || "conveyor";
  const prompt = process.argv[2] || "Hello from Node.js";
  const maxTokens = parseInt(process.argv[3] || "32", 10);
  const id = process.env.JOB_ID || `node-${crypto.randomUUID()}`;
  const redis = new Redis(url);

  const job = { id, prompt, max_tokens: maxTokens, temperature: 0 };
  await redis.xadd(`${prefix}:requests`, "*", "job", JSON.stringify(job));

  const key = `${prefix}:out:${id}`;
  let last = "0";
  for (;;) {
    const reply = await redis.xread("BLOCK", 30000, "STREAMS", key, last);
    if (!reply) throw new Error(`no events for ${id} within 30 s`);
    for (const [entryId, fields] of reply[0][1]) {
      last = entryId;
      const event = JSON.parse(fields[fields.indexOf("event") + 1]);
      if (event.type === "token") {
        process.stdout.write(event.text);
      } else if (event.type === "done") {
        process.stdout.write(`\n[done: ${event.finish_reason}, ${event.usage.completion_tokens} tokens]\n`);
        redis.disconnect();
        return;
      } else {
        process.stderr.write(`\n[error ${event.code}: ${event.message}]\n`);
        redis.disconnect();
        process.exitCode = 1;
        return;
      }
    }
  }
}

main().catch((err) => {
  console.error(err);
  process.exit(1);
});
