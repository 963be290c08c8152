#include "core/json_reader.h"

#include <cctype>
#include <cmath>
#include <limits>
#include <optional>
#include <set>
#include <unordered_map>
#include <vector>

#include "core/files.h"

namespace ptool {

// nlohmann::json keeps an object's members in a std::map: parsing and every lookup are O(log n).
// (ordered_json keeps them in a vector and searches it on every insert and find: an index of 10^6
// weight-map entries took minutes.) File order is recorded by the position pass instead.
using Json = nlohmann::json;

struct JsonDocument {
    std::string file;
    Json root;
    struct Pos {
        int line = 0, column = 0;
    };
    std::unordered_map<const Json*, Pos> value_pos, key_pos;
    std::unordered_map<const Json*, std::vector<std::pair<std::string, const Json*>>> order;  // per object
};

namespace {

constexpr int64_t kMaxSize = int64_t{1} << 40;  // as the YAML reader's sizes

// Line and column (1-based, columns in UTF-8 characters) of byte `at`.
JsonDocument::Pos position_of(const std::string& text, size_t at) {
    JsonDocument::Pos p{1, 1};
    for (size_t i = 0; i < at && i < text.size(); ++i) {
        if (text[i] == '\n')
            ++p.line, p.column = 1;
        else if ((static_cast<unsigned char>(text[i]) & 0xC0) != 0x80)
            ++p.column;
    }
    return p;
}

// Where the error is: `byte` is one past the last character nlohmann read, which is the culprit of
// an invalid literal ("'x'", "NaN", "//"); a whole token in the wrong place (a number after a
// leading zero, an unexpected string) is pointed at from its start.
size_t error_at(const std::string& text, size_t byte) {
    size_t p = std::min(byte, text.size());
    p = p > 0 ? p - 1 : 0;
    auto number_char = [](char c) {
        return std::isdigit(static_cast<unsigned char>(c)) || c == '.' || c == 'e' || c == 'E' || c == '+' ||
               c == '-';
    };
    if (p < text.size() && std::isdigit(static_cast<unsigned char>(text[p])))
        while (p > 0 && number_char(text[p - 1])) --p;
    else if (p < text.size() && text[p] == '"' && p > 0)
        for (size_t q = p - 1; q > 0; --q)
            if (text[q] == '"' && text[q - 1] != '\\') return q;
    return p;
}

// nlohmann's message as json_error_text: the position is ptool's file:line:column.
std::string parse_message(const std::string& what) {
    return "not strict JSON: " + json_error_text(what);
}

// The positions of every value and key of text that nlohmann accepted, walked with the parsed tree.
struct PositionScan {
    const std::string& s;
    JsonDocument& doc;
    size_t i = 0;
    JsonDocument::Pos at{1, 1};

    void advance() {
        if (s[i] == '\n')
            ++at.line, at.column = 1;
        else if ((static_cast<unsigned char>(s[i]) & 0xC0) != 0x80)
            ++at.column;
        ++i;
    }
    void skip_ws() {
        while (i < s.size() && (s[i] == ' ' || s[i] == '\t' || s[i] == '\n' || s[i] == '\r')) advance();
    }
    std::string string_token() {  // s[i] is the opening quote; returns the raw token, quotes included
        const size_t begin = i;
        advance();
        while (i < s.size() && s[i] != '"') {
            if (s[i] == '\\') advance();
            advance();
        }
        advance();
        return s.substr(begin, i - begin);
    }
    // The text of value v (null: a value to walk past, positioning nothing).
    void value(const Json* v) {
        skip_ws();
        if (v) doc.value_pos[v] = at;
        if (s[i] == '{') {
            advance();
            for (;;) {
                skip_ws();
                if (i >= s.size() || s[i] == '}') break;
                if (s[i] == ',') advance(), skip_ws();
                const JsonDocument::Pos key_at = at;
                const std::string key = Json::parse(string_token()).get<std::string>();
                const Json* child = nullptr;
                if (v && v->is_object())
                    if (auto it = v->find(key); it != v->end()) child = &*it;
                if (child) doc.key_pos[child] = key_at, doc.order[v].emplace_back(key, child);
                skip_ws();
                advance();  // ':'
                value(child);
                skip_ws();
            }
            advance();
        } else if (s[i] == '[') {
            advance();
            for (size_t k = 0;; ++k) {
                skip_ws();
                if (i >= s.size() || s[i] == ']') break;
                if (s[i] == ',') advance(), skip_ws();
                value(v && v->is_array() && k < v->size() ? &(*v)[k] : nullptr);
            }
            advance();
        } else if (s[i] == '"') {
            string_token();
        } else {
            while (i < s.size() && std::string_view(",]} \t\r\n").find(s[i]) == std::string_view::npos)
                advance();
        }
    }
};

// The first key that repeats in its object, in text nlohmann accepted (which keeps the last one
// silently, so the parsed tree no longer matches the text): found on the text alone, before the
// position pass walks the tree with it.
std::optional<std::pair<size_t, std::string>> first_duplicate_key(const std::string& s) {
    std::vector<std::pair<bool, std::set<std::string>>> open;  // per open bracket: an object?, its keys
    for (size_t i = 0; i < s.size(); ++i) {
        const char c = s[i];
        if (c == '{' || c == '[')
            open.push_back({c == '{', {}});
        else if ((c == '}' || c == ']') && !open.empty())
            open.pop_back();
        else if (c == '"') {
            const size_t begin = i;
            for (++i; i < s.size() && s[i] != '"'; ++i)
                if (s[i] == '\\') ++i;
            size_t next = i + 1;
            while (next < s.size() &&
                   (s[next] == ' ' || s[next] == '\t' || s[next] == '\n' || s[next] == '\r'))
                ++next;
            if (next >= s.size() || s[next] != ':' || open.empty() || !open.back().first) continue;
            std::string key = Json::parse(s.substr(begin, i + 1 - begin)).get<std::string>();
            if (!open.back().second.insert(key).second) return std::pair{begin, std::move(key)};
        }
    }
    return std::nullopt;
}

std::string shown(const Json& v) {
    std::string t = v.dump(-1, ' ', false, Json::error_handler_t::replace);
    return t.size() > 40 ? t.substr(0, 37) + "..." : t;
}

}  // namespace

void check_depth(const std::string& text, const std::string& name, int max_depth) {
    int depth = 0;
    bool in_string = false;
    for (size_t i = 0; i < text.size(); ++i) {
        const char c = text[i];
        if (in_string) {
            if (c == '\\')
                ++i;
            else if (c == '"')
                in_string = false;
        } else if (c == '"') {
            in_string = true;
        } else if (c == '[' || c == '{') {
            if (++depth > max_depth) {
                const auto p = position_of(text, i);
                throw InputError(SourceLocation{name, p.line, p.column},
                                 fmt::format("nesting deeper than {} levels", max_depth));
            }
        } else if (c == ']' || c == '}') {
            depth = std::max(0, depth - 1);
        }
    }
}

const std::string& JsonNode::file() const {
    return doc_->file;
}

SourceLocation JsonNode::where() const {
    auto it = doc_->value_pos.find(value_);
    return it == doc_->value_pos.end() ? SourceLocation{doc_->file, 0, 0}
                                       : SourceLocation{doc_->file, it->second.line, it->second.column};
}

SourceLocation JsonNode::key_where() const {
    auto it = doc_->key_pos.find(value_);
    return it == doc_->key_pos.end() ? where()
                                     : SourceLocation{doc_->file, it->second.line, it->second.column};
}

void JsonNode::fail(const std::string& message) const {
    throw InputError(where(), message);
}

const char* JsonNode::type_name() const {
    switch (value_->type()) {
        case Json::value_t::object:
            return "an object";
        case Json::value_t::array:
            return "an array";
        case Json::value_t::string:
            return "a string";
        case Json::value_t::boolean:
            return "a boolean";
        case Json::value_t::number_integer:
        case Json::value_t::number_unsigned:
            return "an integer";
        case Json::value_t::number_float:
            return "a number with a fraction or exponent";
        case Json::value_t::null:
            return "null";
        default:
            return "a value";
    }
}

std::string JsonNode::as_string(const std::string& what) const {
    if (!value_->is_string())
        fail(fmt::format("{} must be a string, got {} ({})", what, type_name(), shown(*value_)));
    return value_->get<std::string>();
}

int64_t JsonNode::as_int(const std::string& what) const {
    if (value_->is_number_unsigned() &&
        value_->get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
        fail(fmt::format("{} is too large: {}", what, shown(*value_)));
    if (!value_->is_number_integer())
        fail(fmt::format("{} must be an integer, got {} ({})", what, type_name(), shown(*value_)));
    return value_->get<int64_t>();
}

int64_t JsonNode::as_positive_int(const std::string& what) const {
    const int64_t v = as_int(what);
    if (v <= 0) fail(fmt::format("{} must be positive, got {}", what, v));
    if (v > kMaxSize) fail(fmt::format("{} is too large: {}", what, v));
    return v;
}

double JsonNode::as_number(const std::string& what) const {
    if (!value_->is_number())
        fail(fmt::format("{} must be a number, got {} ({})", what, type_name(), shown(*value_)));
    const double v = value_->get<double>();
    if (!std::isfinite(v)) fail(fmt::format("{} must be a finite number, got {}", what, shown(*value_)));
    return v;
}

bool JsonNode::as_bool(const std::string& what) const {
    if (!value_->is_boolean())
        fail(fmt::format("{} must be true or false, got {} ({})", what, type_name(), shown(*value_)));
    return value_->get<bool>();
}

std::vector<JsonNode> JsonNode::items(const std::string& what) const {
    if (!value_->is_array()) fail(fmt::format("{} must be an array, got {}", what, type_name()));
    std::vector<JsonNode> out;
    for (const Json& v : *value_) out.emplace_back(doc_, &v);
    return out;
}

std::vector<std::pair<std::string, JsonNode>> JsonNode::members(const std::string& what) const {
    if (!value_->is_object()) fail(fmt::format("{} must be an object, got {}", what, type_name()));
    std::vector<std::pair<std::string, JsonNode>> out;
    if (auto it = doc_->order.find(value_); it != doc_->order.end())  // file order (the position pass's)
        for (const auto& [key, v] : it->second) out.emplace_back(key, JsonNode(doc_, v));
    return out;
}

std::optional<JsonNode> JsonNode::get(const std::string& key) const {
    if (!value_->is_object()) fail(fmt::format("must be an object, got {}", type_name()));
    auto it = value_->find(key);
    if (it == value_->end()) return std::nullopt;
    return JsonNode(doc_, &*it);
}

JsonNode JsonNode::at(const std::string& key) const {
    if (auto v = get(key)) return *v;
    fail(fmt::format("the object has no {}", Json(key).dump()));
}

JsonNode load_json_text(const std::string& text, const std::string& name, const JsonLimits& limits) {
    if (text.size() > limits.max_bytes)
        throw InputError(SourceLocation{name, 1, 1}, fmt::format("file is {} bytes, over the limit of {}",
                                                                 text.size(), limits.max_bytes));
    // nlohmann ends its input at a NUL byte (for C strings): "{...}\0anything" would parse as the
    // part before it (found by fuzz_hf_config). JSON text holds no raw NUL, in a string or outside.
    if (const size_t nul = text.find('\0'); nul != std::string::npos) {
        const auto p = position_of(text, nul);
        throw InputError(SourceLocation{name, p.line, p.column},
                         "not strict JSON: a NUL byte (inside a string, write \\u0000)");
    }
    check_depth(text, name, limits.max_depth);
    auto doc = std::make_shared<JsonDocument>();
    doc->file = name;
    try {
        doc->root = Json::parse(text, nullptr, true, /*ignore_comments=*/false);
    } catch (const Json::parse_error& e) {
        const auto p = position_of(text, error_at(text, e.byte));
        throw InputError(SourceLocation{name, p.line, p.column}, parse_message(e.what()));
    } catch (const Json::exception& e) {  // a number beyond double's range ("1e400"): at the literal
        const std::string what = e.what();
        const size_t q = what.find('\''), q2 = q == std::string::npos ? q : what.find('\'', q + 1);
        const size_t at =
            q2 == std::string::npos ? std::string::npos : text.find(what.substr(q + 1, q2 - q - 1));
        const auto p = position_of(text, at == std::string::npos ? 0 : at);
        throw InputError(
            SourceLocation{name, p.line, p.column},
            fmt::format("a number must be a finite number: {}", what.substr(what.find(']') + 2)));
    }
    // Both passes walk text nlohmann accepted, so their tokens parse; were one not to, it is still
    // this file that is not JSON ptool reads (exit 2), never an exception that ends the process.
    try {
        if (const auto dup = first_duplicate_key(text)) {
            const auto p = position_of(text, dup->first);
            throw InputError(
                SourceLocation{name, p.line, p.column},
                fmt::format(
                    "duplicate key {} (JSON leaves which one counts undefined; Python keeps the last)",
                    Json(dup->second).dump()));
        }
        PositionScan scan{text, *doc};
        if (text.compare(0, 3, "\xEF\xBB\xBF") == 0) scan.i = 3;  // a BOM, which nlohmann skips too
        scan.value(&doc->root);
    } catch (const Json::exception& e) {
        throw InputError(SourceLocation{name, 1, 1}, parse_message(e.what()));
    }
    const JsonDocument* root = doc.get();
    return JsonNode(std::move(doc), &root->root);
}

JsonNode load_json(const std::string& path, const JsonLimits& limits) {
    return load_json_text(read_file(path, limits.max_bytes), path, limits);
}

std::optional<std::pair<size_t, std::string>> json_duplicate_key(const std::string& text) {
    return first_duplicate_key(text);
}

std::string json_error_text(const std::string& what) {
    const size_t at = what.find("column ");
    const size_t colon = at == std::string::npos ? std::string::npos : what.find(": ", at);
    const std::string text = colon == std::string::npos ? what : what.substr(colon + 2);
    std::string out;
    for (const char ch : text) {
        const auto c = static_cast<unsigned char>(ch);
        if (c >= 0x80 || c < 0x20 || c == 0x7f)
            out += fmt::format("\\x{:02x}", c);
        else
            out += ch;
    }
    return out;
}

}  // namespace ptool
