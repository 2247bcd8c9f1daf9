// An ACP client for the `keel acp` tests, on the client side of the official TypeScript SDK
// (@agentclientprotocol/sdk, installed by .ci/run under KEEL_ACP_CLIENT_DIR).
//
// usage: node client.mjs SCENARIO   (environment: KEEL_ACP_CLIENT_DIR, KEEL_BIN, KEEL_ARGS (JSON
// array of extra `keel acp` arguments), ACP_CWD, ACP_PROMPT, ACP_MCP (a stdio server command,
// JSON), ACP_PERMISSION (allow_once | allow_always | reject_once | disconnect | hang), ACP_SESSION (to
// load), ACP_CANCEL_AFTER_MS, ACP_WATCHDOG_MS (default 300000: then exit 1 with the transcript))
//
// Scenarios: `prompt` (initialize, session/new, one session/prompt), `load` (initialize,
// session/load, optionally a prompt), `cancel` (a prompt cancelled mid-turn). Prints one JSON
// transcript on standard output: every response, error, update and permission request.
import { spawn } from "node:child_process";
import { Readable, Writable } from "node:stream";
import { pathToFileURL } from "node:url";
import path from "node:path";

const sdkDir = process.env.KEEL_ACP_CLIENT_DIR;
const sdk = await import(
  pathToFileURL(path.join(sdkDir, "node_modules/@agentclientprotocol/sdk/dist/v1/stable/acp.js")).href
);
const { client, ndJsonStream, methods, PROTOCOL_VERSION } = sdk;

const scenario = process.argv[2];
const env = process.env;
const transcript = { scenario, updates: [], permissions: [], responses: {}, errors: {}, fsWrites: [] };
// ACP_FS: the editor's buffers ({absolute path: text}); set, the client offers fs/*.
const buffers = env.ACP_FS ? JSON.parse(env.ACP_FS) : null;

// A run that hangs (an agent blocked on an answer that never comes) fails with its transcript,
// well after anything these tests wait for.
setTimeout(() => {
  transcript.errors.watchdog = "the client gave up after ACP_WATCHDOG_MS";
  print();
  process.exit(1);
}, Number(env.ACP_WATCHDOG_MS || 300000)).unref();

const child = spawn(env.KEEL_BIN, ["acp", ...JSON.parse(env.KEEL_ARGS || "[]")], {
  stdio: ["pipe", "pipe", "inherit"],
});
const stream = ndJsonStream(Writable.toWeb(child.stdin), Readable.toWeb(child.stdout));

const app = client({ name: "keel-acp-test" })
  .onNotification(methods.client.session.update, (cx) => {
    transcript.updates.push(cx.params.update);
  })
  .onRequest(methods.client.fs.readTextFile, (cx) => ({ content: buffers[cx.params.path] ?? "" }))
  .onRequest(methods.client.fs.writeTextFile, (cx) => {
    buffers[cx.params.path] = cx.params.content;
    transcript.fsWrites.push(cx.params);
    return {};
  })
  .onRequest(methods.client.session.requestPermission, async (cx) => {
    transcript.permissions.push(cx.params);
    const choice = env.ACP_PERMISSION || "allow_once";
    if (choice === "hang") {
      // An editor that has not answered yet (the user is away): never answers.
      return new Promise(() => {});
    }
    if (choice === "disconnect") {
      // The editor goes away while the request is open: its end of the pipes closes.
      print();
      process.exit(0);
    }
    return { outcome: { outcome: "selected", optionId: choice } };
  });

function print() {
  process.stdout.write(JSON.stringify(transcript) + "\n");
}

async function call(ctx, name, method, params) {
  try {
    const r = await ctx.request(method, params);
    transcript.responses[name] = r;
    return r;
  } catch (e) {
    transcript.errors[name] = { code: e.code, message: e.message, data: e.data };
    return undefined;
  }
}

await app.connectWith(stream, async (ctx) => {
  await call(ctx, "initialize", methods.agent.initialize, {
    protocolVersion: PROTOCOL_VERSION,
    clientCapabilities: { fs: { readTextFile: !!buffers, writeTextFile: !!buffers } },
    clientInfo: { name: "keel-acp-test", version: "1" },
  });
  let sessionId;
  if (scenario === "load") {
    sessionId = env.ACP_SESSION;
    await call(ctx, "load", methods.agent.session.load, {
      sessionId,
      cwd: env.ACP_CWD,
      mcpServers: env.ACP_MCP ? [JSON.parse(env.ACP_MCP)] : [],
    });
  } else {
    const mcpServers = env.ACP_MCP ? [JSON.parse(env.ACP_MCP)] : [];
    const s = await call(ctx, "new", methods.agent.session.new, { cwd: env.ACP_CWD, mcpServers });
    sessionId = s?.sessionId;
  }
  if (sessionId && env.ACP_MODE) {
    await call(ctx, "setMode", methods.agent.session.setMode, { sessionId, modeId: env.ACP_MODE });
  }
  if (sessionId && env.ACP_PROMPT) {
    const prompt = call(ctx, "prompt", methods.agent.session.prompt, {
      sessionId,
      prompt: [{ type: "text", text: env.ACP_PROMPT }],
    });
    if (scenario === "cancel") {
      await new Promise((r) => setTimeout(r, Number(env.ACP_CANCEL_AFTER_MS || 1000)));
      await ctx.notify(methods.agent.session.cancel, { sessionId });
    }
    await prompt;
  }
  transcript.sessionId = sessionId;
});
print();
child.stdin.end();
await new Promise((r) => child.on("exit", r));
process.exit(0);
