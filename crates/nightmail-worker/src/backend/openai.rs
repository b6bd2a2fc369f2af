//! An OpenAI-compatible chat completions server: llama.cpp's server, vLLM, SGLang, a cloud API.
//! Requests stream (`stream: true`, server-sent events), so progress is seen token by token;
//! reasoning deltas (`reasoning_content`, `reasoning`) and inline `<think>` are kept apart from
//! the answer.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use eventsource_stream::Eventsource;
use futures_util::StreamExt;
use serde_json::{Value, json};
use tokio::sync::{mpsc, watch};

use super::{
    Backend, BackendAnswer, BackendError, BoxFuture, CallRequest, Event, Measure, Request, ThinkSplitter, ToolSpec,
    estimate_tokens,
};
use crate::conversation::{Role, Turn};

pub struct OpenAi {
    client: reqwest::Client,
    /// Servers of the same model, tried in turn from the last that answered.
    servers: Vec<Server>,
    /// The server that answered last.
    preferred: AtomicUsize,
    model: String,
    api_key: Option<String>,
    timeout: Duration,
    retries: u32,
    /// The context each served model reported (`None`: the server reports none), once asked.
    contexts: std::sync::Mutex<std::collections::HashMap<String, Option<usize>>>,
}

struct Server {
    /// Base URL without the trailing slash, e.g. `http://127.0.0.1:8080/v1`.
    url: String,
    /// This server refused a streamed request with tools: ask it for whole answers with tools.
    unstreamed_tools: AtomicBool,
}

/// How long the model list may take: it only tells how long a prompt may be.
const MODELS_TIMEOUT: Duration = Duration::from_secs(3);

/// The context `model` has, as an OpenAI-compatible server's model list (`GET /models`) reports
/// it: vLLM and SGLang say `max_model_len`, OpenRouter and others `context_length`.
fn context_of(models: &Value, model: &str) -> Option<usize> {
    let list = models["data"].as_array()?;
    let entry = list.iter().find(|m| m["id"] == model).or_else(|| (list.len() == 1).then(|| &list[0]))?;
    ["max_model_len", "context_length", "context_window"].iter().find_map(|k| entry[*k].as_u64()).map(|n| n as usize)
}

/// The context a server names when it refuses a prompt as too long, and its count of the prompt
/// when it gives one: llama.cpp's `exceed_context_size_error` carries `n_ctx` and
/// `n_prompt_tokens`; OpenAI and vLLM say "maximum context length is N tokens" in the message
/// (OpenAI adds "your messages resulted in M tokens").
fn context_in_refusal(text: &str) -> Option<(usize, Option<usize>)> {
    let error = serde_json::from_str::<Value>(text).ok().map(|v| v["error"].clone()).unwrap_or(Value::Null);
    if let Some(n) = error["n_ctx"].as_u64() {
        return Some((n as usize, error["n_prompt_tokens"].as_u64().map(|p| p as usize)));
    }
    let message = error["message"].as_str().unwrap_or(text);
    let number_after = |words: &str| -> Option<usize> {
        let after = &message[message.find(words)? + words.len()..];
        after.chars().take_while(char::is_ascii_digit).collect::<String>().parse().ok()
    };
    Some((number_after("maximum context length is ")?, number_after("resulted in ")))
}

impl OpenAi {
    /// A backend for the servers at `urls` (at least one), which serve the same model.
    pub fn new(urls: &[String], model: &str, api_key: Option<String>, timeout: Duration, retries: u32) -> OpenAi {
        assert!(!urls.is_empty(), "an openai backend needs a server");
        let client = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(10))
            .build()
            .expect("an HTTP client with default TLS settings builds");
        let servers = urls
            .iter()
            .map(|url| Server { url: url.trim_end_matches('/').to_string(), unstreamed_tools: AtomicBool::new(false) })
            .collect();
        OpenAi {
            client,
            servers,
            preferred: AtomicUsize::new(0),
            model: model.to_string(),
            api_key,
            timeout,
            retries,
            contexts: Default::default(),
        }
    }

    /// The answer from the server that answered last, else from the next in turn: a server that
    /// cannot be reached, or fails mid-answer, hands the request on (the answer starts over,
    /// `Event::Restarted`). Refusals (4xx, a prompt too long, a stop) are final.
    async fn answer(
        &self,
        request: &Request,
        events: mpsc::UnboundedSender<Event>,
        stop: watch::Receiver<bool>,
    ) -> Result<BackendAnswer, BackendError> {
        let first = self.preferred.load(Ordering::Relaxed);
        let mut failures = Vec::new();
        for k in 0..self.servers.len() {
            let i = (first + k) % self.servers.len();
            let server = &self.servers[i];
            match self.answer_from(server, request, events.clone(), stop.clone()).await {
                Ok(answer) => {
                    self.preferred.store(i, Ordering::Relaxed);
                    return Ok(answer);
                }
                Err(BackendError::Transient(e)) => {
                    if k + 1 < self.servers.len() {
                        tracing::warn!("openai backend: {} failed ({e}); asking the next server", server.url);
                        let _ = events.send(Event::Restarted);
                    }
                    failures.push(e);
                }
                Err(other) => return Err(other),
            }
        }
        Err(BackendError::Transient(failures.join("; then ")))
    }

    /// A request with tools: streamed, unless this server refused a streamed one before; then (and
    /// on such a refusal) asked for whole.
    async fn answer_from(
        &self,
        server: &Server,
        request: &Request,
        events: mpsc::UnboundedSender<Event>,
        stop: watch::Receiver<bool>,
    ) -> Result<BackendAnswer, BackendError> {
        if request.tools.is_empty() {
            return self.run(server, request, events, stop).await;
        }
        if !server.unstreamed_tools.load(Ordering::Relaxed) {
            match self.run(server, request, events.clone(), stop.clone()).await {
                Err(BackendError::Transient(e) | BackendError::Permanent(e)) => {
                    tracing::warn!(
                        "openai backend: a streamed request with tools failed ({e}); asking {} for whole answers with tools from now on",
                        server.url
                    );
                    server.unstreamed_tools.store(true, Ordering::Relaxed);
                }
                other => return other,
            }
        }
        self.run_whole(server, request, events, stop).await
    }

    async fn run_whole(
        &self,
        server: &Server,
        request: &Request,
        events: mpsc::UnboundedSender<Event>,
        mut stop: watch::Receiver<bool>,
    ) -> Result<BackendAnswer, BackendError> {
        let mut body = self.body(request);
        body["stream"] = json!(false);
        if let Some(object) = body.as_object_mut() {
            object.remove("stream_options");
        }
        let response = self.send(server, &body, &mut stop).await?;
        let whole: Value = tokio::select! {
            read = tokio::time::timeout(self.timeout, response.json()) => match read {
                Ok(Ok(whole)) => whole,
                Ok(Err(e)) => return Err(BackendError::Transient(format!("the server's answer was not JSON: {e}"))),
                Err(_) => return Err(BackendError::Transient(format!("the server sent no answer within {} s", self.timeout.as_secs()))),
            },
            _ = stop.wait_for(|s| *s) => return Err(BackendError::Stopped),
        };
        let mut answer =
            super::unstreamed::answer(&whole, request.model.clone().unwrap_or_else(|| self.model.clone()))?;
        // Told as one piece, so progress shows it as a streamed answer's would.
        let (content, reasoning) = (std::mem::take(&mut answer.content), std::mem::take(&mut answer.reasoning));
        if !reasoning.is_empty() {
            record(&mut answer, &events, Event::Reasoning(reasoning));
        }
        let mut think = ThinkSplitter::default();
        for e in think.push(&content).into_iter().chain(think.finish()) {
            record(&mut answer, &events, e);
        }
        Ok(answer)
    }

    /// The context the server that answered last reports for `model`, asked once (a server that
    /// cannot be reached is asked again next time).
    async fn context(&self, model: &str) -> Option<usize> {
        if let Some(known) = self.contexts.lock().expect("contexts lock").get(model) {
            return *known;
        }
        let server = &self.servers[self.preferred.load(Ordering::Relaxed)];
        let mut get = self.client.get(format!("{}/models", server.url));
        if let Some(key) = &self.api_key {
            get = get.bearer_auth(key);
        }
        let response = tokio::time::timeout(MODELS_TIMEOUT, get.send()).await.ok()?.ok()?;
        let found = match response.status().is_success() {
            true => tokio::time::timeout(MODELS_TIMEOUT, response.json::<Value>())
                .await
                .ok()?
                .ok()
                .and_then(|list| context_of(&list, model)),
            false => None,
        };
        self.contexts.lock().expect("contexts lock").insert(model.to_string(), found);
        found
    }

    fn body(&self, request: &Request) -> Value {
        let messages: Vec<Value> = request.turns.iter().map(message).collect();
        let mut body = json!({
            "model": request.model.as_deref().unwrap_or(&self.model),
            "messages": messages,
            "stream": true,
            "stream_options": { "include_usage": true },
            "max_tokens": request.max_tokens,
            "temperature": request.temperature,
        });
        if !request.tools.is_empty() {
            body["tools"] = request.tools.iter().map(ToolSpec::to_json).collect();
            body["tool_choice"] = json!("auto");
        }
        if let Some(reasoning) = request.reasoning {
            // The convention of llama.cpp, vLLM and SGLang for templates that can think.
            body["chat_template_kwargs"] = json!({ "enable_thinking": reasoning });
        }
        body
    }

    /// Sends the request, retrying refused connections, 429 and 5xx with backoff (1 s, 2 s, ...).
    async fn send(
        &self,
        server: &Server,
        body: &Value,
        stop: &mut watch::Receiver<bool>,
    ) -> Result<reqwest::Response, BackendError> {
        let endpoint = format!("{}/chat/completions", server.url);
        let mut last = String::new();
        for attempt in 0..=self.retries {
            if attempt > 0 {
                let wait = Duration::from_secs(1 << (attempt - 1).min(6));
                tokio::select! {
                    _ = tokio::time::sleep(wait) => {}
                    _ = stop.wait_for(|s| *s) => return Err(BackendError::Stopped),
                }
            }
            let mut post = self.client.post(&endpoint).json(body);
            if let Some(key) = &self.api_key {
                post = post.bearer_auth(key);
            }
            let sent = tokio::select! {
                sent = tokio::time::timeout(self.timeout, post.send()) => sent,
                _ = stop.wait_for(|s| *s) => return Err(BackendError::Stopped),
            };
            match sent {
                Err(_) => last = format!("{endpoint} did not answer within {} s", self.timeout.as_secs()),
                Ok(Err(e)) => last = format!("{endpoint}: {e}"),
                Ok(Ok(response)) => {
                    let status = response.status();
                    if status.is_success() {
                        return Ok(response);
                    }
                    let text = response.text().await.unwrap_or_default();
                    let text: String = text.chars().take(500).collect();
                    last = format!("{endpoint} answered {status}: {text}");
                    if let Some((context, prompt_tokens)) = context_in_refusal(&text) {
                        // Learned for the next measure, which fits the prompt to it.
                        let model = body["model"].as_str().unwrap_or(&self.model).to_string();
                        self.contexts.lock().expect("contexts lock").insert(model, Some(context));
                        return Err(BackendError::ContextExceeded { context, prompt_tokens, message: last });
                    }
                    if !(status.is_server_error() || status.as_u16() == 429 || status.as_u16() == 408) {
                        return Err(BackendError::Permanent(last));
                    }
                }
            }
            tracing::warn!(attempt, "openai backend: {last}");
        }
        Err(BackendError::Transient(last))
    }

    async fn run(
        &self,
        server: &Server,
        request: &Request,
        events: mpsc::UnboundedSender<Event>,
        mut stop: watch::Receiver<bool>,
    ) -> Result<BackendAnswer, BackendError> {
        let body = self.body(request);
        let response = self.send(server, &body, &mut stop).await?;
        let mut stream = response.bytes_stream().eventsource();
        let mut outcome = BackendAnswer {
            model: request.model.clone().unwrap_or_else(|| self.model.clone()),
            ..BackendAnswer::default()
        };
        let mut think = ThinkSplitter::default();
        let (mut content_chunks, mut reasoning_chunks) = (0u64, 0u64);
        let mut usage_seen = false;
        let mut done = false;
        let mut calls = StreamedCalls::default();
        loop {
            let next = tokio::select! {
                next = tokio::time::timeout(self.timeout, stream.next()) => next,
                _ = stop.wait_for(|s| *s) => return Err(BackendError::Stopped),
            };
            let event = match next {
                Err(_) => {
                    return Err(BackendError::Transient(format!(
                        "the server sent nothing for {} s in the middle of an answer",
                        self.timeout.as_secs()
                    )));
                }
                Ok(None) => break,
                Ok(Some(Err(e))) => return Err(BackendError::Transient(format!("the answer stream broke: {e}"))),
                Ok(Some(Ok(event))) => event,
            };
            if event.data.trim() == "[DONE]" {
                done = true;
                break;
            }
            let Ok(chunk) = serde_json::from_str::<Value>(&event.data) else {
                tracing::warn!(data = %event.data.chars().take(200).collect::<String>(), "openai backend: unreadable chunk");
                continue;
            };
            if let Some(error) = chunk.get("error") {
                return Err(BackendError::Transient(format!("the server reported an error mid-answer: {error}")));
            }
            if let Some(usage) = chunk.get("usage").filter(|u| u.is_object()) {
                usage_seen = true;
                outcome.prompt_tokens = usage["prompt_tokens"].as_u64();
                let completion = usage["completion_tokens"].as_u64().unwrap_or(0);
                outcome.reasoning_tokens = usage["completion_tokens_details"]["reasoning_tokens"].as_u64().unwrap_or(0);
                outcome.output_tokens = completion.saturating_sub(outcome.reasoning_tokens);
            }
            let Some(choice) = chunk["choices"].get(0) else { continue };
            if let Some(reason) = choice["finish_reason"].as_str() {
                outcome.finish_reason = reason.to_string();
            }
            let delta = &choice["delta"];
            for key in ["reasoning_content", "reasoning"] {
                if let Some(text) = delta[key].as_str().filter(|t| !t.is_empty()) {
                    reasoning_chunks += 1;
                    outcome.reasoning.push_str(text);
                    let _ = events.send(Event::Reasoning(text.to_string()));
                }
            }
            if let Some(parts) = delta["tool_calls"].as_array() {
                calls.add(parts);
            }
            if let Some(text) = delta["content"].as_str().filter(|t| !t.is_empty()) {
                content_chunks += 1;
                for e in think.push(text) {
                    record(&mut outcome, &events, e);
                }
            }
        }
        // OpenAI's stream ends with `data: [DONE]`, and its last choice carries a finish reason: a
        // stream that closes with neither was cut off (a proxy or the server died), and its text is
        // an interrupted answer, not a complete one.
        if !done && outcome.finish_reason.is_empty() {
            return Err(BackendError::Transient(
                "the answer stream ended before the server said it was complete (no [DONE], no finish reason)".into(),
            ));
        }
        for e in think.finish() {
            record(&mut outcome, &events, e);
        }
        if !usage_seen {
            // Servers that send no usage stream about one token per chunk.
            outcome.output_tokens = content_chunks;
            outcome.reasoning_tokens = reasoning_chunks;
        }
        outcome.calls = calls.finish();
        if outcome.content.trim().is_empty() && outcome.reasoning.trim().is_empty() && outcome.calls.is_empty() {
            return Err(BackendError::Transient("the server's answer was empty".into()));
        }
        Ok(outcome)
    }
}

/// A turn as an OpenAI chat message: an assistant turn's calls as `tool_calls`, a tool turn with
/// the `tool_call_id` it answers.
fn message(turn: &Turn) -> Value {
    match turn.role {
        Role::Assistant if !turn.calls.is_empty() => json!({
            "role": "assistant",
            "content": turn.content,
            "tool_calls": turn.calls.iter().map(|c| json!({
                "id": c.id,
                "type": "function",
                "function": { "name": c.name, "arguments": c.arguments },
            })).collect::<Vec<_>>(),
        }),
        Role::Tool => {
            let call = turn.calls.first();
            json!({
                "role": "tool",
                "tool_call_id": call.map(|c| c.id.as_str()).unwrap_or_default(),
                "name": call.map(|c| c.name.as_str()).unwrap_or_default(),
                "content": turn.content,
            })
        }
        _ => json!({ "role": turn.role.as_str(), "content": turn.content }),
    }
}

/// Tool calls as a stream gives them: pieces of each call (`index`, then its `id`, name and
/// arguments in fragments) put back together.
#[derive(Default)]
struct StreamedCalls {
    calls: Vec<CallRequest>,
}

impl StreamedCalls {
    fn add(&mut self, parts: &[Value]) {
        for part in parts {
            let index = part["index"].as_u64().map_or(self.calls.len().saturating_sub(1), |i| i as usize);
            while self.calls.len() <= index {
                let n = self.calls.len();
                self.calls.push(CallRequest {
                    id: format!("call_{n}"),
                    name: String::new(),
                    arguments: String::new(),
                    malformed: None,
                });
            }
            let call = &mut self.calls[index];
            if let Some(id) = part["id"].as_str().filter(|id| !id.is_empty()) {
                call.id = id.to_string();
            }
            let function = &part["function"];
            if let Some(name) = function["name"].as_str() {
                call.name.push_str(name);
            }
            match &function["arguments"] {
                Value::String(text) => call.arguments.push_str(text),
                // Some servers send the arguments as an object rather than its JSON text.
                v @ Value::Object(_) => call.arguments.push_str(&v.to_string()),
                _ => {}
            }
        }
    }

    fn finish(self) -> Vec<CallRequest> {
        self.calls.into_iter().map(|c| CallRequest::named(c.id, c.name, c.arguments)).collect()
    }
}

fn record(outcome: &mut BackendAnswer, events: &mpsc::UnboundedSender<Event>, event: Event) {
    match &event {
        Event::Content(t) => outcome.content.push_str(t),
        Event::Reasoning(t) => outcome.reasoning.push_str(t),
        Event::Checkpoint { .. } | Event::Engine(_) | Event::Prompt { .. } | Event::Restarted => {}
    }
    let _ = events.send(event);
}

impl Backend for OpenAi {
    fn describe(&self) -> String {
        let urls: Vec<&str> = self.servers.iter().map(|s| s.url.as_str()).collect();
        format!("openai {} at {}", self.model, urls.join(", then "))
    }

    fn measure<'a>(&'a self, request: &'a Request) -> BoxFuture<'a, Result<Measure, BackendError>> {
        Box::pin(async move {
            let context = self.context(request.model.as_deref().unwrap_or(&self.model)).await;
            Ok(Measure { prompt_tokens: estimate_tokens(&request.turns), exact: false, context })
        })
    }

    fn generate<'a>(
        &'a self,
        request: &'a Request,
        events: mpsc::UnboundedSender<Event>,
        stop: watch::Receiver<bool>,
    ) -> BoxFuture<'a, Result<BackendAnswer, BackendError>> {
        Box::pin(self.answer(request, events, stop))
    }
}

#[cfg(test)]
mod tests {
    //! Against an in-process stand-in for an OpenAI-compatible server, speaking plain HTTP/1.1:
    //! the real-server test (llama.cpp's server) is in the workspace's tests/worker.rs.
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[test]
    fn the_context_is_read_from_a_refusal() {
        let llama = r#"{"error":{"code":400,"message":"the request exceeds the available context size","type":"exceed_context_size_error","n_prompt_tokens":5000,"n_ctx":4096}}"#;
        assert_eq!(context_in_refusal(llama), Some((4096, Some(5000))));
        let openai = r#"{"error":{"message":"This model's maximum context length is 8192 tokens. However, your messages resulted in 9000 tokens.","type":"invalid_request_error","code":"context_length_exceeded"}}"#;
        assert_eq!(context_in_refusal(openai), Some((8192, Some(9000))));
        assert_eq!(context_in_refusal("This model's maximum context length is 2048 tokens"), Some((2048, None)));
        assert_eq!(context_in_refusal(r#"{"error":{"message":"bad temperature"}}"#), None);
    }

    #[test]
    fn the_context_is_read_from_the_model_list() {
        let vllm = json!({"data": [{"id": "a", "max_model_len": 100}, {"id": "b", "max_model_len": 32768}]});
        assert_eq!(context_of(&vllm, "b"), Some(32768));
        let one = json!({"data": [{"id": "served", "context_length": 4096}]});
        assert_eq!(context_of(&one, "asked-by-another-name"), Some(4096), "a server of one model serves it");
        assert_eq!(context_of(&json!({"data": [{"id": "x"}]}), "x"), None, "llama.cpp's list says no context");
        assert_eq!(context_of(&json!({"object": "list"}), "x"), None);
    }

    /// Serves each canned response to one connection, in order; returns the base URL and the
    /// request bodies received.
    async fn stub(responses: Vec<String>) -> (String, tokio::task::JoinHandle<Vec<String>>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/v1", listener.local_addr().unwrap());
        let task = tokio::spawn(async move {
            let mut bodies = Vec::new();
            for response in responses {
                let (mut socket, _) = listener.accept().await.unwrap();
                let mut request = Vec::new();
                let mut buf = [0u8; 4096];
                // Read the head, then Content-Length bytes of body.
                let body = loop {
                    let n = socket.read(&mut buf).await.unwrap();
                    request.extend_from_slice(&buf[..n]);
                    let text = String::from_utf8_lossy(&request).to_string();
                    if let Some(end) = text.find("\r\n\r\n") {
                        let length: usize = text
                            .lines()
                            .find_map(|l| {
                                l.to_ascii_lowercase()
                                    .strip_prefix("content-length:")
                                    .map(|v| v.trim().parse().unwrap())
                            })
                            .unwrap_or(0);
                        if request.len() >= end + 4 + length {
                            break String::from_utf8_lossy(&request[end + 4..end + 4 + length]).to_string();
                        }
                    }
                };
                bodies.push(body);
                socket.write_all(response.as_bytes()).await.unwrap();
                socket.shutdown().await.unwrap();
            }
            bodies
        });
        (url, task)
    }

    fn sse(chunks: &[&str]) -> String {
        let body: String = chunks.iter().map(|c| format!("data: {c}\n\n")).collect::<String>() + "data: [DONE]\n\n";
        http_stream(&body)
    }

    /// An event stream that stops after `chunks`, without `[DONE]`.
    fn sse_cut(chunks: &[&str]) -> String {
        http_stream(&chunks.iter().map(|c| format!("data: {c}\n\n")).collect::<String>())
    }

    fn http_stream(body: &str) -> String {
        format!(
            "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        )
    }

    fn status(code: u16, text: &str) -> String {
        format!(
            "HTTP/1.1 {code} X\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{text}",
            text.len()
        )
    }

    fn request() -> Request {
        Request {
            turns: vec![Turn::new(Role::System, "sys"), Turn::new(Role::User, "2+2?")],
            max_tokens: 64,
            temperature: 0.0,
            reasoning: Some(true),
            model: None,
            checkpoint: None,
            tools: Vec::new(),
        }
    }

    async fn run(backend: &OpenAi) -> (Result<BackendAnswer, BackendError>, Vec<Event>) {
        let (tx, mut rx) = mpsc::unbounded_channel();
        let (_stop_tx, stop) = watch::channel(false);
        let result = backend.generate(&request(), tx, stop).await;
        let mut events = Vec::new();
        while let Ok(e) = rx.try_recv() {
            events.push(e);
        }
        (result, events)
    }

    #[tokio::test]
    async fn streams_content_and_keeps_reasoning_apart() {
        let (url, server) = stub(vec![sse(&[
            r#"{"choices":[{"delta":{"reasoning_content":"add them"}}]}"#,
            r#"{"choices":[{"delta":{"content":"<think>hmm</think>The answer"}}]}"#,
            r#"{"choices":[{"delta":{"content":" is 4."},"finish_reason":"stop"}]}"#,
            r#"{"choices":[],"usage":{"prompt_tokens":12,"completion_tokens":9,"completion_tokens_details":{"reasoning_tokens":3}}}"#,
        ])])
        .await;
        let backend = OpenAi::new(std::slice::from_ref(&url), "m", Some("k".into()), Duration::from_secs(10), 0);
        let (result, events) = run(&backend).await;
        let outcome = result.unwrap();
        assert_eq!(outcome.content, "The answer is 4.");
        assert_eq!(outcome.reasoning, "add themhmm");
        assert_eq!((outcome.prompt_tokens, outcome.output_tokens, outcome.reasoning_tokens), (Some(12), 6, 3));
        assert_eq!(outcome.finish_reason, "stop");
        assert_eq!(events.first(), Some(&Event::Reasoning("add them".into())));
        let body: Value = serde_json::from_str(&server.await.unwrap()[0]).unwrap();
        assert_eq!(body["model"], "m");
        assert_eq!(body["stream"], true);
        assert_eq!(body["messages"][1], json!({"role": "user", "content": "2+2?"}));
        assert_eq!(body["chat_template_kwargs"]["enable_thinking"], true);
    }

    #[tokio::test]
    async fn a_stream_cut_before_its_end_is_an_interrupted_answer() {
        let (url, _server) = stub(vec![sse_cut(&[r#"{"choices":[{"delta":{"content":"The answer is"}}]}"#])]).await;
        let backend = OpenAi::new(std::slice::from_ref(&url), "m", None, Duration::from_secs(10), 0);
        let (result, _) = run(&backend).await;
        assert!(
            matches!(result, Err(BackendError::Transient(ref m)) if m.contains("no [DONE], no finish reason")),
            "{result:?}"
        );
        // A finish reason without [DONE] (some servers omit it) is a complete answer.
        let (url, _server) =
            stub(vec![sse_cut(&[r#"{"choices":[{"delta":{"content":"4."},"finish_reason":"stop"}]}"#])]).await;
        let backend = OpenAi::new(std::slice::from_ref(&url), "m", None, Duration::from_secs(10), 0);
        assert_eq!(run(&backend).await.0.unwrap().content, "4.");
    }

    #[tokio::test]
    async fn server_errors_are_retried_and_client_errors_are_not() {
        let (url, server) =
            stub(vec![status(503, "busy"), sse(&[r#"{"choices":[{"delta":{"content":"ok"}}]}"#])]).await;
        let backend = OpenAi::new(std::slice::from_ref(&url), "m", None, Duration::from_secs(10), 1);
        let (result, _) = run(&backend).await;
        assert_eq!(result.unwrap().content, "ok");
        assert_eq!(server.await.unwrap().len(), 2);

        let (url, _server) = stub(vec![status(400, r#"{"error":"bad model"}"#)]).await;
        let backend = OpenAi::new(std::slice::from_ref(&url), "m", None, Duration::from_secs(10), 3);
        let (result, _) = run(&backend).await;
        assert!(
            matches!(result, Err(BackendError::Permanent(ref m)) if m.contains("400") && m.contains("bad model")),
            "{result:?}"
        );
    }

    /// Servers of one model: one that is down, or that fails mid-answer, hands the request to
    /// the next and the answer starts over; the one that answered is asked first next time.
    #[tokio::test]
    async fn a_server_down_or_failing_mid_answer_hands_the_request_to_the_next() {
        let down = format!(
            "http://127.0.0.1:{}/v1",
            std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
        );
        let (cut_url, cut) = stub(vec![sse_cut(&[r#"{"choices":[{"delta":{"content":"The ans"}}]}"#])]).await;
        let answer = |text: &str| {
            sse(&[&format!(r#"{{"choices":[{{"delta":{{"content":"{text}"}},"finish_reason":"stop"}}]}}"#)])
        };
        let (good_url, good) = stub(vec![answer("4."), answer("Again 4.")]).await;
        let backend = OpenAi::new(&[down, cut_url, good_url.clone()], "m", None, Duration::from_secs(5), 0);
        assert!(backend.describe().ends_with(&format!(", then {good_url}")), "{}", backend.describe());
        let (result, events) = run(&backend).await;
        assert_eq!(result.unwrap().content, "4.");
        let restarted = Event::Restarted;
        assert_eq!(
            events,
            [restarted.clone(), Event::Content("The ans".into()), restarted, Event::Content("4.".into())]
        );
        let (result, events) = run(&backend).await;
        assert_eq!(
            (result.unwrap().content, events),
            ("Again 4.".to_string(), vec![Event::Content("Again 4.".into())])
        );
        assert_eq!((cut.await.unwrap().len(), good.await.unwrap().len()), (1, 2));
    }

    /// A refusal is the model's answer to the request, not a server being down: not handed on.
    #[tokio::test]
    async fn a_refusal_is_not_handed_to_the_next_server() {
        let (refusing, _server) = stub(vec![status(400, r#"{"error":"bad temperature"}"#)]).await;
        let (other, asked) = stub(vec![]).await;
        let backend = OpenAi::new(&[refusing, other], "m", None, Duration::from_secs(5), 0);
        let (result, _) = run(&backend).await;
        assert!(matches!(result, Err(BackendError::Permanent(ref m)) if m.contains("bad temperature")), "{result:?}");
        assert!(asked.await.unwrap().is_empty());
    }

    #[tokio::test]
    async fn a_refused_connection_is_transient() {
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let backend = OpenAi::new(&[format!("http://127.0.0.1:{port}/v1")], "m", None, Duration::from_secs(5), 0);
        let (result, _) = run(&backend).await;
        assert!(matches!(result, Err(BackendError::Transient(_))), "{result:?}");
    }
}
