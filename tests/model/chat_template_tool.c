/* Renders conversations with a model's chat template and tokenizes them, for
 * chat_template_hf_test.py: chat_template_tool MODEL.gguf [TEMPLATE_FILE] reads one JSON
 * object per stdin line, {"messages": [...], "tools": [...]?, "thinking": -1|0|1,
 * "add_generation_prompt": bool}, and writes one JSON line per input:
 * {"ids": [...], "text": "...", "in_reasoning": bool} or {"error": "..."}. The template is
 * TEMPLATE_FILE's text when given, else the GGUF's tokenizer.chat_template; the first output
 * line is {"thinking_default": bool}. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <json-c/json.h>

#include "model/chat_template.h"
#include "model/tokenizer.h"

static char *read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    size_t cap = 1 << 16, n = 0;
    char *p = malloc(cap);
    size_t k;
    while (p && (k = fread(p + n, 1, cap - n, f)) > 0) {
        n += k;
        if (n == cap) p = realloc(p, cap *= 2);
    }
    fclose(f);
    *len = n;
    return p;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: chat_template_tool MODEL.gguf [TEMPLATE_FILE]\n");
        return 2;
    }
    tokenizer *tok;
    status st = {0};
    if (tokenizer_load_path(&tok, argv[1], &st)) {
        fprintf(stderr, "%s\n", st.msg);
        return 1;
    }
    size_t len;
    char *src = NULL;
    const char *text;
    if (argc > 2) {
        if (!(src = read_file(argv[2], &len))) {
            fprintf(stderr, "cannot read %s\n", argv[2]);
            return 1;
        }
        text = src;
    } else if (!(text = tokenizer_chat_template(tok, &len))) {
        fprintf(stderr, "%s: no tokenizer.chat_template\n", argv[1]);
        return 1;
    }
    chat_template *t;
    char err[1024];
    if (chat_template_parse(text, len, &t, err, sizeof err)) {
        fprintf(stderr, "parse: %s\n", err);
        return 1;
    }
    printf("{\"thinking_default\": %s}\n", chat_template_thinking_default(t) ? "true" : "false");
    char *line = NULL;
    size_t cap = 0;
    ssize_t n;
    while ((n = getline(&line, &cap, stdin)) > 0) {
        json_object *req = json_tokener_parse(line), *msgs = NULL, *tools = NULL, *v;
        json_object *res = json_object_new_object();
        int thinking = -1;
        bool gen = true;
        if (!req) {
            fprintf(stderr, "bad JSON line\n");
            return 1;
        }
        json_object_object_get_ex(req, "messages", &msgs);
        json_object_object_get_ex(req, "tools", &tools);
        if (json_object_object_get_ex(req, "thinking", &v)) thinking = json_object_get_int(v);
        if (json_object_object_get_ex(req, "add_generation_prompt", &v))
            gen = json_object_get_boolean(v);
        char *out;
        size_t out_len;
        bool in_reasoning;
        if (chat_template_render_chat(t, msgs, tools, thinking, gen, &out, &out_len,
                                      &in_reasoning, err, sizeof err)) {
            json_object_object_add(res, "error", json_object_new_string(err));
        } else {
            int32_t *ids;
            size_t n_ids;
            if (tokenizer_encode(tok, out, out_len, &ids, &n_ids, &st)) {
                json_object_object_add(res, "error", json_object_new_string(st.msg));
            } else {
                json_object *a = json_object_new_array();
                for (size_t i = 0; i < n_ids; i++)
                    json_object_array_add(a, json_object_new_int(ids[i]));
                json_object_object_add(res, "ids", a);
                json_object_object_add(res, "text", json_object_new_string_len(out, (int)out_len));
                json_object_object_add(res, "in_reasoning", json_object_new_boolean(in_reasoning));
                free(ids);
            }
            free(out);
        }
        printf("%s\n", json_object_to_json_string_ext(res, JSON_C_TO_STRING_PLAIN));
        fflush(stdout);
        json_object_put(res);
        json_object_put(req);
    }
    free(line);
    chat_template_free(t);
    free(src);
    tokenizer_destroy(tok);
    return 0;
}
