/* The splitter of a chat model's generated text into reasoning, answer and tool calls, fed the
 * text as it streams (Qwen3.5's format, the one its chat template teaches):
 *
 *     reasoning text</think>answer text<tool_call>
 *     <function=NAME>
 *     <parameter=P>
 *     value
 *     </parameter>
 *     </function>
 *     </tool_call>
 *
 * Only the markers are removed: the newlines around <think> / </think> stay in the reasoning and
 * the answer (as vLLM's qwen3 reasoning parser leaves them), so the concatenation of what is
 * emitted, with the markers put back, is the generated text. A request whose prompt ends inside
 * <think> (in_reasoning) starts in reasoning; otherwise an output that begins with "<think>"
 * enters reasoning there, and "<think>" anywhere later is answer text. <tool_call> blocks are
 * recognised in the answer only (inside reasoning they are reasoning text).
 *
 * Pieces are cut anywhere between UTF-8 characters; text that may be the start of a marker is
 * held back until the next bytes decide it. A tool call is emitted when its </tool_call> arrives
 * (or at finish, if its </function> came): its arguments are the text of one JSON object made
 * from the <parameter=...> blocks the way vLLM's qwen3_coder parser makes them — one leading and
 * one trailing newline of a value dropped; "null" (any case) is null; with the tool's JSON Schema
 * (tools given, the function and the parameter found), string types stay strings, integer types
 * are JSON integers, number types JSON numbers, boolean types true/false, any other type any
 * JSON value, each falling back to the string when the value does not parse as that; a parameter
 * the schema does not list stays a string; with no schema for the function, a value that is
 * JSON is that value, anything else a string. A block that is not a well-formed call (no
 * </function>, text outside <function=...>, an empty name) is emitted as answer text, markers
 * included, never lost.
 *
 * Memory: the splitter owns a tool-call buffer and an arguments buffer, allocated at creation
 * and grown only when a call is longer than any before; feeding text outside tool calls never
 * allocates. Validating a JSON parameter value uses json-c's parser (allocates, once per
 * parameter of a completed call, never per piece). Not thread safe: one splitter per stream. */
#ifndef DS_MODEL_CHAT_SPLIT_H
#define DS_MODEL_CHAT_SPLIT_H

#include <stdbool.h>
#include <stddef.h>

struct json_object;

typedef enum { CHAT_PIECE_REASONING = 1, CHAT_PIECE_CONTENT = 2, CHAT_PIECE_TOOL_CALL = 3 } chat_piece_kind;

/* One emitted piece; every pointer is borrowed for the duration of the sink call. */
typedef struct {
    chat_piece_kind kind;
    const char *text; /* REASONING / CONTENT: [len] bytes, not NUL-terminated */
    size_t len;
    const char *name;      /* TOOL_CALL: the function's name, NUL-terminated */
    const char *arguments; /* TOOL_CALL: the text of one JSON object, NUL-terminated */
    int index;             /* TOOL_CALL: 0, 1, ... in the order of the request's calls */
} chat_piece;

typedef void (*chat_split_sink)(void *ud, const chat_piece *p);

typedef struct chat_split chat_split;

/* A splitter, reset for a request without reasoning and tools; NULL when out of memory. */
chat_split *chat_split_new(void);
void chat_split_free(chat_split *s);

/* Per request: in_reasoning = the prompt ended inside <think>; tools = the request's tools (a
 * json-c array of OpenAI {type, function: {name, parameters}}, may be NULL; borrowed until the
 * next reset). Held text of the previous request is dropped. */
void chat_split_reset(chat_split *s, bool in_reasoning, struct json_object *tools);

/* Splits the next len bytes of generated text (whole UTF-8 characters) and emits, in order,
 * what they decide. Returns 0, or -1 when out of memory growing the tool-call buffers (the
 * splitter then passes the rest of the call through as answer text). */
int chat_split_feed(chat_split *s, const char *text, size_t len, chat_split_sink sink, void *ud);

/* The end of the output: held text is emitted as what it is (reasoning, answer, or the tool
 * call if its </function> came, else the block as answer text). Returns 0 or -1 (out of
 * memory). The splitter needs a reset before the next request. */
int chat_split_finish(chat_split *s, chat_split_sink sink, void *ud);

/* Whether the splitter is inside reasoning now. */
bool chat_split_in_reasoning(const chat_split *s);

/* The reasoning is always a prefix of the output, its markers included: bytes [0, end) of the
 * text fed. Returns end as known so far: with *final false it may still grow (the output is
 * in reasoning, or may yet open with "<think>"), and the bytes before it are reasoning for
 * certain; with *final true it is exact (0: the output has no reasoning; SIZE_MAX: the output
 * ended inside reasoning, so all of it is). A caller that knows where each token's text starts
 * in the fed text counts the reasoning tokens exactly with it (router_chat.h). */
size_t chat_split_reasoning_end(const chat_split *s, bool *final);

#endif
