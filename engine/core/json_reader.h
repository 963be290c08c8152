// Strict JSON reading, with positions: Hugging Face config.json files and safetensors indexes.
//
// A config.json is JSON, not YAML: read as YAML, single quotes, trailing commas, comments, leading
// zeros and `"false"` strings were all accepted (HF's Python would refuse some and read others
// differently). So the text is parsed by nlohmann-json, strictly (RFC 8259: no comments, trailing
// commas, NaN or Infinity; UTF-8 checked), and every value is typed: a field that wants an integer
// takes a JSON integer, a boolean true or false, a string a string; numbers are finite. A second
// pass over the accepted text gives each value and key its line:column, so every refusal, of the
// syntax or of a field, is InputError at the JSON file's own file:line:column. Duplicate keys
// (which Python's json keeps the last of, silently) are refused; size and nesting are bounded.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "core/error.h"

namespace ptool {

struct JsonLimits {
    size_t max_bytes = 1 << 20;
    int max_depth = 64;
};

struct JsonDocument;  // the parsed value and every value's and key's position

class JsonNode {
public:
    JsonNode(std::shared_ptr<const JsonDocument> doc, const nlohmann::json* value)
        : doc_(std::move(doc)), value_(value) {}

    const nlohmann::json& value() const { return *value_; }
    const std::string& file() const;
    SourceLocation where() const;      // the value's first character
    SourceLocation key_where() const;  // its key's, for an object member (else where())
    [[noreturn]] void fail(const std::string& message) const;

    bool is_object() const { return value_->is_object(); }
    bool is_array() const { return value_->is_array(); }
    bool is_null() const { return value_->is_null(); }
    const char* type_name() const;  // "an object", "a string", "an integer", ... for messages

    std::string as_string(const std::string& what) const;        // a JSON string
    int64_t as_int(const std::string& what) const;               // a JSON integer (no fraction or exponent)
    int64_t as_positive_int(const std::string& what) const;      // in [1, 2^40]
    double as_number(const std::string& what) const;             // a finite JSON number
    bool as_bool(const std::string& what) const;                 // true or false, not "false" nor 0
    std::vector<JsonNode> items(const std::string& what) const;  // an array's elements
    std::vector<std::pair<std::string, JsonNode>> members(
        const std::string& what) const;                         // an object's, in file order
    std::optional<JsonNode> get(const std::string& key) const;  // an object's member, if present
    JsonNode at(const std::string& key) const;                  // required

private:
    std::shared_ptr<const JsonDocument> doc_;
    const nlohmann::json* value_;
};

// `text` as strict JSON; InputError at name:line:column for anything that is not.
JsonNode load_json_text(const std::string& text, const std::string& name, const JsonLimits& limits = {});
// Exit 2 at the first bracket nested deeper than max_depth (strings skipped, escapes too), found
// before a parser recurses on it (load_json_text's; a safetensors header's).
void check_depth(const std::string& text, const std::string& name, int max_depth);
// The first key that repeats in its object in valid JSON `text` (nlohmann keeps the last silently):
// its offset in the text and the key; nullopt where none does.
std::optional<std::pair<size_t, std::string>> json_duplicate_key(const std::string& text);
// nlohmann's parse error without its prefix ("[json.exception.parse_error.101] parse error at line
// 1, column 5: ") and with every byte a terminal could take for a control (>= 0x80: a C1 CSI is
// 0x9b; below 0x20) written as \xHH: its "last read" quotes the file's raw bytes.
std::string json_error_text(const std::string& what);
JsonNode load_json(const std::string& path, const JsonLimits& limits = {});  // read through core/files.h

}  // namespace ptool
