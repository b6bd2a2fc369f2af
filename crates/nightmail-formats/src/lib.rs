//! Model files as people download them, read in place: GGUF files (`gguf.rs`, written by
//! `gguf_write.rs`), Hugging Face directories of safetensors (`hf.rs`, with fused experts split
//! and MXFP4 pairs repacked on the way in), one [`ModelFile`] over both; and the text around the
//! weights: tokenizers (`tokenizer.rs`, SentencePiece in `tokenizer/spm.rs`) and chat templates
//! (`chat.rs`), with the tool calls each family writes read back in `chat/tool_syntax/`. It knows
//! no architecture's math: names and bytes only.

pub mod chat;
mod error;
mod fused_experts;
pub mod gguf;
pub mod gguf_write;
pub mod hf;
mod model_file;
pub mod mxfp4_pair;
mod names;
pub mod tokenizer;

pub use chat::{
    ChatMessage, ChatTemplate, FunctionCall, MalformedCall, ParsedTurn, RenderOptions, ToolArguments, ToolCall,
    ToolSyntax,
};
pub use error::{FormatError, Result};
pub use gguf::{GgufFile, STRIPE_PARTS, value_as_u64 as gguf_value_as_u64};
pub use hf::HfDir;
pub use hf::read_json_opt;
pub use model_file::{Format, ModelFile};
pub use names::*;
pub use tokenizer::TextTokenizer;
