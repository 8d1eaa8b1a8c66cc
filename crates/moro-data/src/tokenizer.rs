//! The model's tokenizer (`tokenizer.json`, through the `tokenizers` crate, the engine of
//! transformers' fast tokenizers) with its chat template and special tokens
//! (`tokenizer_config.json`, `chat_template.jinja`), and each sample counted as TRL 0.2x
//! tokenizes it (`trl/trainer/sft_trainer.py` `tokenize`, `trl/trainer/dpo_trainer.py`
//! `tokenize_row`, `trl/data_utils.py` `maybe_apply_chat_template`).

use serde_json::{Value, json};
use tokenizers::Tokenizer;

use crate::template::{ChatTemplate, Date, SpecialTokens};
use crate::{DataError, Part, Sample};

/// The prompt axolotl's `alpaca` type and Stanford Alpaca put around an instruction, used for a
/// tokenizer without a chat template.
const ALPACA_WITH_INPUT: &str = "Below is an instruction that describes a task, paired with an input that provides further context. Write a response that appropriately completes the request.\n\n### Instruction:\n{instruction}\n\n### Input:\n{input}\n\n### Response:\n";
const ALPACA_NO_INPUT: &str = "Below is an instruction that describes a task. Write a response that appropriately completes the request.\n\n### Instruction:\n{instruction}\n\n### Response:\n";

/// How long one sample is, in tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SampleLengths {
    /// The longest sequence the sample puts in a batch (for a preference pair, the longer of
    /// prompt + chosen and prompt + rejected).
    pub tokens: u32,
    /// The prompt's tokens (no loss on them under completion-only training), where the shape
    /// has a prompt.
    pub prompt: Option<u32>,
}

/// A tokenizer with the template and special tokens training uses.
pub struct ModelTokenizer {
    tokenizer: Tokenizer,
    template: Option<ChatTemplate>,
    eos_id: Option<u32>,
}

impl std::fmt::Debug for ModelTokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ModelTokenizer")
            .field("vocab", &self.tokenizer.get_vocab_size(true))
            .field("chat_template", &self.template.is_some())
            .finish_non_exhaustive()
    }
}

impl ModelTokenizer {
    /// From the bytes of `tokenizer.json`, of `tokenizer_config.json` if there is one, and of a
    /// chat template that replaces the config's (`chat_template.jinja`, or `--chat-template`).
    pub fn from_bytes(
        tokenizer_json: &[u8],
        config_json: Option<&[u8]>,
        template: Option<&str>,
        today: Date,
    ) -> Result<Self, DataError> {
        let mut tokenizer = load_tokenizer(tokenizer_json).map_err(|e| {
            DataError::new(format!("tokenizer.json does not load: {e}"))
                .hint("it should be the tokenizer.json of a Hugging Face fast tokenizer")
        })?;
        // A saved truncation or padding would change the lengths being measured.
        tokenizer
            .with_truncation(None)
            .map_err(|e| DataError::new(format!("tokenizer.json: {e}")))?;
        tokenizer.with_padding(None);
        let config: Value = match config_json {
            Some(bytes) => serde_json::from_slice(bytes)
                .map_err(|e| DataError::new(format!("tokenizer_config.json is not JSON: {e}")))?,
            None => Value::Null,
        };
        let special = SpecialTokens {
            bos: token(&config, "bos_token"),
            eos: token(&config, "eos_token"),
            unk: token(&config, "unk_token"),
            pad: token(&config, "pad_token"),
        };
        let eos_id = special
            .eos
            .as_deref()
            .and_then(|t| tokenizer.token_to_id(t));
        let source = match template {
            Some(t) => Some(t.to_owned()),
            None => config_template(&config)?,
        };
        let template = source
            .map(|src| ChatTemplate::new(&src, special, today))
            .transpose()
            .map_err(DataError::new)?;
        Ok(Self {
            tokenizer,
            template,
            eos_id,
        })
    }

    /// From the vocabulary of a GGUF header read with its arrays whole
    /// ([`crate::gguf_vocab::WHOLE_ARRAYS`]), its special tokens and chat template
    /// (`template`, from a file, replaces it).
    ///
    /// # Errors
    /// The vocabulary is missing, malformed or of a kind not modelled
    /// ([`crate::gguf_vocab::tokenizer_files`]).
    pub fn from_gguf(
        header: &moro_core::formats::gguf::GgufHeader,
        template: Option<&str>,
        today: Date,
    ) -> Result<Self, DataError> {
        let (tokenizer, config) = crate::gguf_vocab::tokenizer_files(header)?;
        let bytes = |v: &Value| {
            serde_json::to_vec(v).map_err(|e| DataError::new(format!("GGUF vocabulary: {e}")))
        };
        Self::from_bytes(&bytes(&tokenizer)?, Some(&bytes(&config)?), template, today)
    }

    /// Whether a chat template came with the tokenizer.
    pub fn has_chat_template(&self) -> bool {
        self.template.is_some()
    }

    /// The token ids of `text`, with the tokenizer's special tokens (BOS) when asked.
    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>, String> {
        self.tokenizer
            .encode_fast(text, add_special_tokens)
            .map(|e| e.get_ids().to_vec())
            .map_err(|e| format!("cannot tokenize: {e}"))
    }

    fn count(&self, text: &str, add_special_tokens: bool) -> Result<u32, String> {
        let n = self
            .tokenizer
            .encode_fast(text, add_special_tokens)
            .map_err(|e| format!("cannot tokenize: {e}"))?
            .len();
        u32::try_from(n).map_err(|_| "a sample of more than 4 billion tokens".to_owned())
    }

    /// The conversation rendered with the chat template.
    pub fn render(
        &self,
        messages: &[Value],
        tools: Option<&Value>,
        add_generation_prompt: bool,
    ) -> Result<String, String> {
        let template = self.template.as_ref().ok_or_else(|| {
            "the tokenizer has no chat template, and the sample is a conversation (give \
             --chat-template FILE)"
                .to_owned()
        })?;
        template.render(messages, tools, add_generation_prompt)
    }

    /// `apply_chat_template(messages, tokenize=True)`: rendered, then encoded without adding
    /// special tokens (the template writes its own).
    pub fn chat_ids(
        &self,
        messages: &[Value],
        tools: Option<&Value>,
        add_generation_prompt: bool,
    ) -> Result<Vec<u32>, String> {
        self.encode(&self.render(messages, tools, add_generation_prompt)?, false)
    }

    fn chat_count(
        &self,
        messages: &[Value],
        tools: Option<&Value>,
        generation: bool,
    ) -> Result<u32, String> {
        self.count(&self.render(messages, tools, generation)?, false)
    }

    /// Text with the EOS TRL appends when it is not already last.
    fn text_with_eos(&self, text: &str) -> Result<u32, String> {
        let ids = self.encode(text, true)?;
        let eos = u32::from(self.eos_id.is_some_and(|e| ids.last() != Some(&e)));
        u32::try_from(ids.len())
            .map(|n| n + eos)
            .map_err(|_| "too long".to_owned())
    }

    /// How many tokens the sample is.
    pub fn measure(&self, sample: &Sample) -> Result<SampleLengths, String> {
        match sample {
            Sample::Text(text) => Ok(SampleLengths {
                tokens: self.text_with_eos(text)?,
                prompt: None,
            }),
            Sample::Conversation { messages, tools } => {
                let tools = tools.as_ref();
                let tokens = self.chat_count(messages, tools, false)?;
                let last_assistant = messages
                    .iter()
                    .rposition(|m| m.get("role").and_then(Value::as_str) == Some("assistant"));
                let prompt = match last_assistant {
                    Some(i) if i > 0 => Some(self.chat_count(&messages[..i], tools, true)?),
                    _ => None,
                };
                Ok(SampleLengths { tokens, prompt })
            }
            Sample::Instruction {
                system,
                instruction,
                input,
                output,
            } => {
                if self.template.is_some() {
                    let mut prompt = Vec::new();
                    if let Some(s) = system {
                        prompt.push(json!({"role": "system", "content": s}));
                    }
                    let user = if input.is_empty() {
                        instruction.clone()
                    } else {
                        format!("{instruction}\n{input}")
                    };
                    prompt.push(json!({"role": "user", "content": user}));
                    let completion = vec![json!({"role": "assistant", "content": output})];
                    self.prompt_completion(&Part::Messages(prompt), &Part::Messages(completion))
                } else {
                    let prompt = if input.is_empty() {
                        ALPACA_NO_INPUT.replace("{instruction}", instruction)
                    } else {
                        ALPACA_WITH_INPUT
                            .replace("{instruction}", instruction)
                            .replace("{input}", input)
                    };
                    self.prompt_completion(&Part::Text(prompt), &Part::Text(output.clone()))
                }
            }
            Sample::PromptCompletion { prompt, completion } => {
                self.prompt_completion(prompt, completion)
            }
            Sample::Preference {
                prompt,
                chosen,
                rejected,
            } => {
                let (p, c) = self.preference_side(prompt, chosen)?;
                let (_, r) = self.preference_side(prompt, rejected)?;
                Ok(SampleLengths {
                    tokens: p + c.max(r),
                    prompt: Some(p),
                })
            }
        }
    }

    /// SFT's prompt-completion: the prompt alone and the whole, EOS appended to text.
    fn prompt_completion(&self, prompt: &Part, completion: &Part) -> Result<SampleLengths, String> {
        match (prompt, completion) {
            (Part::Text(p), Part::Text(c)) => Ok(SampleLengths {
                tokens: self.text_with_eos(&format!("{p}{c}"))?,
                prompt: Some(self.count(p, true)?),
            }),
            (Part::Messages(p), Part::Messages(c)) => {
                let whole: Vec<Value> = p.iter().chain(c).cloned().collect();
                Ok(SampleLengths {
                    tokens: self.chat_count(&whole, None, false)?,
                    prompt: Some(self.chat_count(p, None, true)?),
                })
            }
            _ => Err("`prompt` and `completion` are not both strings or both messages".to_owned()),
        }
    }

    /// DPO's prompt and one answer: the prompt with the generation prompt, the answer as the
    /// rest of the rendered conversation, then EOS (`tokenize_row`).
    fn preference_side(&self, prompt: &Part, answer: &Part) -> Result<(u32, u32), String> {
        let eos = u32::from(self.eos_id.is_some());
        match (prompt, answer) {
            (Part::Text(p), Part::Text(a)) => {
                Ok((self.count(p, true)?, self.count(a, false)? + eos))
            }
            (Part::Messages(p), Part::Messages(a)) => {
                let prompt_text = self.render(p, None, true)?;
                let whole: Vec<Value> = p.iter().chain(a).cloned().collect();
                let whole_text = self.render(&whole, None, false)?;
                let answer_text = whole_text
                    .strip_prefix(prompt_text.as_str())
                    .unwrap_or(&whole_text);
                Ok((
                    self.count(&prompt_text, false)?,
                    self.count(answer_text, false)? + eos,
                ))
            }
            _ => Err("the prompt and the answers are not both strings or both messages".to_owned()),
        }
    }
}

/// `Tokenizer::from_bytes`, whose deserializers (tokenizers 0.22 `decoders/mod.rs`) unwrap
/// some malformed values instead of returning an error: such a panic is caught, silently, and
/// is an error.
fn load_tokenizer(bytes: &[u8]) -> Result<Tokenizer, String> {
    match crate::contain::contained(|| Tokenizer::from_bytes(bytes)) {
        Some(r) => r.map_err(|e| e.to_string()),
        None => Err("a malformed field (the tokenizers library could not read it)".to_owned()),
    }
}

/// A special token as `tokenizer_config.json` writes it: a string, or an `AddedToken` object.
fn token(config: &Value, key: &str) -> Option<String> {
    match config.get(key)? {
        Value::String(s) => Some(s.clone()),
        Value::Object(o) => o.get("content")?.as_str().map(str::to_owned),
        _ => None,
    }
}

/// `chat_template` of `tokenizer_config.json`: one template, or a list of named ones of which
/// transformers uses `default`.
fn config_template(config: &Value) -> Result<Option<String>, DataError> {
    match config.get("chat_template") {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(Value::Array(list)) => {
            let named = |want: &str| {
                list.iter().find_map(|t| {
                    (t.get("name")?.as_str()? == want)
                        .then(|| t.get("template")?.as_str().map(str::to_owned))
                        .flatten()
                })
            };
            Ok(named("default").or_else(|| {
                list.first()
                    .and_then(|t| t.get("template")?.as_str().map(str::to_owned))
            }))
        }
        Some(_) => Err(DataError::new(
            "tokenizer_config.json: `chat_template` is neither a string nor a list of templates",
        )),
    }
}
