/* The chat template's public calls (chat_template.h): render, and an OpenAI-shaped
 * conversation normalised and rendered. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/chat_template_internal.h"

int chat_template_render(const chat_template *t, struct json_object *vars, char **out,
                         size_t *len, char *err, size_t errlen)
{
    *out = NULL;
    *len = 0;
    if (vars && !json_object_is_type(vars, json_type_object)) {
        snprintf(err, errlen, "the template's variables must be a JSON object");
        return -1;
    }
    ct_buf b = {0};
    if (ct_eval_render(t, vars, &b, err, errlen)) {
        free(b.p);
        return -1;
    }
    if (!b.p && !ct_buf_add(&b, "", 0)) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    *out = b.p;
    *len = b.n;
    return 0;
}

/* A copy of message i with tool calls' JSON-text arguments parsed to objects. */
static json_object *normalise_message(json_object *m, size_t i, char *err, size_t errlen)
{
    json_object *role, *calls;
    if (!json_object_is_type(m, json_type_object)) {
        snprintf(err, errlen, "messages[%zu]: not an object", i);
        return NULL;
    }
    if (!json_object_object_get_ex(m, "role", &role) ||
        !json_object_is_type(role, json_type_string)) {
        snprintf(err, errlen, "messages[%zu].role: missing or not a string", i);
        return NULL;
    }
    json_object *c = NULL;
    if (json_object_deep_copy(m, &c, NULL) || !c) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    if (!json_object_object_get_ex(c, "tool_calls", &calls) || !calls ||
        json_object_is_type(calls, json_type_null))
        return c;
    if (!json_object_is_type(calls, json_type_array)) {
        snprintf(err, errlen, "messages[%zu].tool_calls: not an array", i);
        json_object_put(c);
        return NULL;
    }
    for (size_t k = 0; k < json_object_array_length(calls); k++) {
        json_object *tc = json_object_array_get_idx(calls, k), *fn, *args;
        if (!json_object_is_type(tc, json_type_object) ||
            !json_object_object_get_ex(tc, "function", &fn) ||
            !json_object_is_type(fn, json_type_object)) {
            snprintf(err, errlen, "messages[%zu].tool_calls[%zu].function: missing or not an "
                     "object", i, k);
            json_object_put(c);
            return NULL;
        }
        if (!json_object_object_get_ex(fn, "arguments", &args) ||
            !json_object_is_type(args, json_type_string))
            continue;
        enum json_tokener_error jerr;
        json_object *parsed = json_tokener_parse_verbose(json_object_get_string(args), &jerr);
        if (!parsed || !json_object_is_type(parsed, json_type_object)) {
            snprintf(err, errlen, "messages[%zu].tool_calls[%zu].function.arguments: not a "
                     "JSON object (%s)", i, k,
                     parsed ? "another JSON value" : json_tokener_error_desc(jerr));
            json_object_put(parsed);
            json_object_put(c);
            return NULL;
        }
        json_object_object_add(fn, "arguments", parsed);
    }
    return c;
}

/* Whether text ends inside an open <think> block. */
static bool ends_in_think(const char *s, size_t n)
{
    static const char open[] = "<think>", close[] = "</think>";
    size_t last_open = (size_t)-1, last_close = (size_t)-1;
    for (size_t i = 0; i + sizeof open - 1 <= n; i++) {
        if (!memcmp(s + i, open, sizeof open - 1)) last_open = i;
        if (i + sizeof close - 1 <= n && !memcmp(s + i, close, sizeof close - 1)) last_close = i;
    }
    return last_open != (size_t)-1 && (last_close == (size_t)-1 || last_close < last_open);
}

int chat_template_render_chat(const chat_template *t, struct json_object *messages,
                              struct json_object *tools, int thinking,
                              bool add_generation_prompt, char **out, size_t *len,
                              bool *in_reasoning, char *err, size_t errlen)
{
    *out = NULL;
    *len = 0;
    if (in_reasoning) *in_reasoning = false;
    if (!messages || !json_object_is_type(messages, json_type_array)) {
        snprintf(err, errlen, "messages: not an array");
        return -1;
    }
    if (tools && !json_object_is_type(tools, json_type_array) &&
        !json_object_is_type(tools, json_type_null)) {
        snprintf(err, errlen, "tools: not an array");
        return -1;
    }
    json_object *vars = json_object_new_object(), *msgs = json_object_new_array();
    int rc = -1;
    if (!vars || !msgs) {
        snprintf(err, errlen, "out of memory");
        json_object_put(msgs);
        goto done;
    }
    json_object_object_add(vars, "messages", msgs);
    for (size_t i = 0; i < json_object_array_length(messages); i++) {
        json_object *m = normalise_message(json_object_array_get_idx(messages, i), i, err,
                                           errlen);
        if (!m) goto done;
        json_object_array_add(msgs, m);
    }
    if (tools && json_object_is_type(tools, json_type_array))
        json_object_object_add(vars, "tools", json_object_get(tools));
    json_object_object_add(vars, "add_generation_prompt",
                           json_object_new_boolean(add_generation_prompt));
    if (thinking >= 0)
        json_object_object_add(vars, "enable_thinking", json_object_new_boolean(thinking > 0));
    rc = chat_template_render(t, vars, out, len, err, errlen);
    if (!rc && in_reasoning) *in_reasoning = ends_in_think(*out, *len);
done:
    json_object_put(vars);
    return rc;
}

bool chat_template_thinking_default(const chat_template *t)
{
    json_object *msgs = json_tokener_parse("[{\"role\":\"user\",\"content\":\"Hello\"}]");
    if (!msgs) return false;
    char *r[3] = {NULL, NULL, NULL};
    size_t n[3] = {0, 0, 0};
    char err[256];
    bool ok = true;
    for (int i = 0; i < 3 && ok; i++)
        ok = chat_template_render_chat(t, msgs, NULL, i - 1, true, &r[i], &n[i], NULL, err,
                                       sizeof err) == 0;
    /* r[0]: undefined, r[1]: false, r[2]: true */
    bool same_as_true = ok && n[0] == n[2] && !memcmp(r[0], r[2], n[0]);
    bool switch_works = ok && (n[1] != n[2] || memcmp(r[1], r[2], n[1]));
    for (int i = 0; i < 3; i++) free(r[i]);
    json_object_put(msgs);
    return same_as_true && switch_works;
}
