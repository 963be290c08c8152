#include "core/yaml_reader.h"

#include <yaml-cpp/eventhandler.h>

#include <algorithm>
#include <fstream>
#include <numeric>
#include <set>
#include <sstream>
#include <string_view>
#include <tuple>
#include <utility>

#include "core/numbers.h"

namespace ptool {
namespace {

// yaml-cpp 0.7's LoadAll loops forever, allocating, on a token no rule consumes in block context
// (a ',' outside brackets: jbeder/yaml-cpp#1040, fixed upstream by #1319): each call to
// HandleNextDocument "starts" a document at the same position. This pass walks the documents with
// a parser that only notes where each starts, and stops at the first that makes no progress or at
// the second document, which a ptool file never has.
struct DocumentStarts : YAML::EventHandler {
    std::vector<YAML::Mark> starts;
    void OnDocumentStart(const YAML::Mark& m) override { starts.push_back(m); }
    void OnDocumentEnd() override {}
    void OnNull(const YAML::Mark&, YAML::anchor_t) override {}
    void OnAlias(const YAML::Mark&, YAML::anchor_t) override {}
    void OnScalar(const YAML::Mark&, const std::string&, YAML::anchor_t, const std::string&) override {}
    void OnSequenceStart(const YAML::Mark&, const std::string&, YAML::anchor_t,
                         YAML::EmitterStyle::value) override {}
    void OnSequenceEnd() override {}
    void OnMapStart(const YAML::Mark&, const std::string&, YAML::anchor_t,
                    YAML::EmitterStyle::value) override {}
    void OnMapEnd() override {}
};

void check_documents(const std::string& text, const std::string& name) {
    std::istringstream in(text);
    YAML::Parser parser(in);
    DocumentStarts docs;
    try {
        while (docs.starts.size() < 3 && parser.HandleNextDocument(docs)) {
            const size_t n = docs.starts.size();
            if (n >= 2 && docs.starts[n - 1].pos == docs.starts[n - 2].pos) {
                const YAML::Mark& m = docs.starts.back();
                const char c = m.pos >= 0 && static_cast<size_t>(m.pos) < text.size() ? text[m.pos] : '?';
                throw InputError(
                    SourceLocation{name, m.line + 1, m.column + 1},
                    fmt::format("unexpected '{}' (outside brackets it cannot start a value)", c));
            }
        }
    } catch (const YAML::Exception& e) {
        throw InputError(SourceLocation{name, e.mark.line + 1, e.mark.column + 1}, e.msg);
    }
    if (docs.starts.size() >= 2) {
        const YAML::Mark& m = docs.starts[1];
        throw InputError(SourceLocation{name, m.line + 1, m.column + 1},
                         "a second YAML document: a file holds one ('---' starts another)");
    }
}

void check_size(const std::string& text, const std::string& name, const YamlLimits& limits) {
    if (text.size() > limits.max_bytes)
        throw InputError(SourceLocation{name, 1, 1}, fmt::format("file is {} bytes, over the limit of {}",
                                                                 text.size(), limits.max_bytes));
}

// Rejects documents whose nesting would make yaml-cpp recurse deeply, before it parses them. Its
// brackets are counted outside quoted scalars and comments as YAML reads them: a quote opens a
// scalar only where one starts (a line's first, or after ':', '-', '?', ',', '[' or '{'), a double-
// quoted one's \" does not close it (a single-quoted one's '' closes and reopens it), and '#' opens a
// comment only after a space or at a line's start: a quote or '#' inside a plain scalar (x"y, a#b)
// is text, and taking it for more would leave the brackets after it uncounted.
void prescan(const std::string& text, const std::string& name, const YamlLimits& limits) {
    check_size(text, name, limits);
    int line = 1, col = 0, flow = 0, dashes = 0;
    bool in_comment = false, line_start = true, escaped = false, closed_single = false;
    char quote = 0, prev = '\n', prev_mark = '\n';  // the line's last character, and last but spaces
    for (char c : text) {
        ++col;
        // yaml-cpp skips one in a comment and misreads one elsewhere ("unknown escape character"):
        // YAML text holds no raw NUL, in a comment, a string or outside
        if (c == '\0')
            throw InputError(SourceLocation{name, line, col},
                             "a NUL byte: YAML text holds none (inside a double-quoted string, write \\0)");
        if (c == '\n') {
            ++line, col = 0, in_comment = false, line_start = true, dashes = 0, prev = prev_mark = '\n';
            continue;
        }
        if (in_comment) continue;
        if (quote) {
            if (escaped)
                escaped = false;
            else if (quote == '"' && c == '\\')
                escaped = true;
            else if (c == quote)
                closed_single = quote == '\'', quote = 0, prev = prev_mark = c;
            continue;
        }
        if (std::exchange(closed_single, false) && c == '\'') {  // '' inside a single-quoted scalar
            quote = c;
            continue;
        }
        if (line_start && c != ' ' && c != '-') line_start = false;
        if (line_start && col > 4 * limits.max_depth)
            throw InputError(SourceLocation{name, line, col}, "indentation is deeper than the nesting limit");
        if (c == '-' && line_start && ++dashes > limits.max_depth)
            throw InputError(SourceLocation{name, line, col}, "block sequences nest deeper than the limit");
        const bool spaced = prev == ' ' || prev == '\t' || prev == '\n';
        if (c == '#' && spaced)
            in_comment = true;
        else if ((c == '"' || c == '\'') &&
                 std::string_view("\n:-?,[{").find(prev_mark) != std::string_view::npos)
            quote = c;
        else if (c == '[' || c == '{') {
            if (++flow > limits.max_depth)
                throw InputError(SourceLocation{name, line, col},
                                 fmt::format("nesting deeper than {} levels", limits.max_depth));
        } else if (c == ']' || c == '}')
            flow = std::max(0, flow - 1);
        prev = c;
        if (c != ' ' && c != '\t') prev_mark = c;
    }
}

bool valid_utf8(const std::string& s) {
    for (size_t i = 0; i < s.size();) {
        const unsigned char c = static_cast<unsigned char>(s[i]);
        const int n = c < 0x80 ? 0 : (c >> 5) == 6 ? 1 : (c >> 4) == 14 ? 2 : (c >> 3) == 30 ? 3 : -1;
        if (n < 0 || i + n >= s.size() + (n == 0)) return false;
        for (int k = 1; k <= n; ++k)
            if ((static_cast<unsigned char>(s[i + k]) >> 6) != 2) return false;
        if ((n == 1 && c < 0xC2) || (n == 2 && c == 0xE0 && static_cast<unsigned char>(s[i + 1]) < 0xA0) ||
            (n == 3 && (c > 0xF4 || (c == 0xF0 && static_cast<unsigned char>(s[i + 1]) < 0x90))))
            return false;  // overlong encodings, beyond U+10FFFF
        i += n + 1;
    }
    return true;
}

// What ptool's YAML is: plain maps, sequences and scalars. Tags (!!python/object, !!binary),
// merge keys and anchors that contain themselves are refused where they stand, as are strings
// that are not UTF-8, the node count and the nesting depth over their limits.
struct TreeCheck {
    std::shared_ptr<const std::string> file;
    const YamlLimits& limits;
    int64_t count = 0;
    std::vector<YAML::Node> ancestors;

    [[noreturn]] void fail(const YAML::Node& n, const std::string& msg) const {
        YamlNode(n, std::const_pointer_cast<std::string>(file)).fail(msg);
    }

    void scalar(const YAML::Node& n) const {
        if (!valid_utf8(n.Scalar())) fail(n, "text that is not valid UTF-8");
    }

    void check(const YAML::Node& node) {
        if (++count > limits.max_nodes)
            fail(node, fmt::format("the document has more than {} nodes", limits.max_nodes));
        if (static_cast<int>(ancestors.size()) > limits.max_depth)
            fail(node, "nesting deeper than the limit");
        for (const YAML::Node& a : ancestors)
            if (a.is(node))
                fail(node, "an alias refers to a node that contains it (a cycle): write the value out");
        const std::string& tag = node.Tag();
        if (!tag.empty() && tag != "?" && tag != "!")
            fail(node, fmt::format("YAML tags are not supported ('{}'): write the plain value", tag));
        if (node.IsScalar()) return scalar(node);
        ancestors.push_back(node);
        if (node.IsMap()) {
            for (const auto& kv : node) {
                if (kv.first.IsScalar() && kv.first.Scalar() == "<<" && kv.first.Tag() == "?")
                    fail(kv.first, "merge keys ('<<') are not supported: write the keys out");
                check(kv.first);
                check(kv.second);
            }
        } else if (node.IsSequence()) {
            for (const auto& item : node) check(item);
        }
        ancestors.pop_back();
    }
};

size_t edit_distance(const std::string& a, const std::string& b) {
    std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
    for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
    for (size_t i = 1; i <= a.size(); ++i) {
        cur[0] = i;
        for (size_t j = 1; j <= b.size(); ++j)
            cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] != b[j - 1])});
        std::swap(prev, cur);
    }
    return prev[b.size()];
}

}  // namespace

SourceLocation YamlNode::where() const {
    const YAML::Mark m = node_.Mark();
    if (m.is_null()) return SourceLocation{file_ ? *file_ : "", 0, 0};
    return SourceLocation{file_ ? *file_ : "", m.line + 1, m.column + 1};
}

void YamlNode::fail(const std::string& message) const {
    throw InputError(where(), message);
}

namespace {

// Unicode format characters that hide text or reorder what a terminal shows after them: zero-width
// spaces and joiners, the bidirectional marks, embeddings, overrides and isolates, word joiners and
// invisible operators, the byte order mark (a name `net\u200b1` shows as `net1`, and U+202E
// reverses the rest of a warning's line)
constexpr std::pair<char32_t, char32_t> kHiddenFormat[] = {
    {0x200B, 0x200F}, {0x202A, 0x202E}, {0x2060, 0x2064}, {0x2066, 0x2069}, {0xFEFF, 0xFEFF}};

// The code point of the 3-byte UTF-8 sequence at s[i] where it is one of kHiddenFormat, else 0.
char32_t hidden_format_at(const std::string& s, size_t i) {
    if (i + 2 >= s.size()) return 0;
    const auto b0 = static_cast<unsigned char>(s[i]), b1 = static_cast<unsigned char>(s[i + 1]),
               b2 = static_cast<unsigned char>(s[i + 2]);
    if ((b0 & 0xf0) != 0xe0 || (b1 & 0xc0) != 0x80 || (b2 & 0xc0) != 0x80) return 0;
    const char32_t cp = (char32_t{b0} & 0x0f) << 12 | (char32_t{b1} & 0x3f) << 6 | (char32_t{b2} & 0x3f);
    for (const auto& [lo, hi] : kHiddenFormat)
        if (cp >= lo && cp <= hi) return cp;
    return 0;
}

}  // namespace

// Every string a YAML file gives (a key, a name, a pattern, a cluster's name) reaches messages,
// reports and the terminal: a control character in it (an escape sequence, a carriage return that
// rewrites the line, a line end that forges one) is refused, tabs excepted, and the C1 controls'
// UTF-8 too, as are the format characters that hide or reorder text (kHiddenFormat). (No input of
// ptool's holds a multi-line string.)
std::string YamlNode::as_string(const std::string& what) const {
    if (!node_.IsScalar()) fail(fmt::format("{} must be a string", what));
    const std::string& s = node_.Scalar();
    for (size_t i = 0; i < s.size(); ++i) {
        if (const char32_t cp = hidden_format_at(s, i))
            fail(
                fmt::format("{} holds the invisible or bidirectional format character U+{:04X} (byte {} "
                            "of the string), which hides or reorders what a terminal shows",
                            what, static_cast<uint32_t>(cp), i));
        const auto c = static_cast<unsigned char>(s[i]);
        const bool c1 = c == 0xc2 && i + 1 < s.size() && static_cast<unsigned char>(s[i + 1]) >= 0x80 &&
                        static_cast<unsigned char>(s[i + 1]) <= 0x9f;
        if ((c < 0x20 && c != '\t') || c == 0x7f || c1)
            fail(fmt::format("{} holds the control character U+{:04X} (byte {} of the string)", what,
                             c1 ? static_cast<unsigned char>(s[i + 1]) : c, i));
    }
    return s;
}

int64_t YamlNode::as_int(const std::string& what) const {
    if (!node_.IsScalar()) fail(fmt::format("{} must be an integer", what));
    const std::string& s = node_.Scalar();
    const auto v = parse_whole_int(s);  // the whole scalar: "2abc", "2.0" and "1e3" are not integers
    if (!v) fail(fmt::format("{} must be an integer, got '{}'", what, s));
    return *v;
}

int64_t YamlNode::as_positive_int(const std::string& what) const {
    int64_t v = as_int(what);
    if (v <= 0) fail(fmt::format("{} must be positive, got {}", what, v));
    if (v > (int64_t{1} << 40)) fail(fmt::format("{} is too large: {}", what, v));
    return v;
}

double YamlNode::as_double(const std::string& what) const {
    if (!node_.IsScalar()) fail(fmt::format("{} must be a number", what));
    const std::string& s = node_.Scalar();
    const auto v = parse_finite(s);  // the whole scalar, finite: no nan, inf, hex or 1e999
    if (!v) fail(fmt::format("{} must be a finite number, got '{}'", what, s));
    return *v;
}

bool YamlNode::as_bool(const std::string& what) const {
    if (node_.IsScalar()) {
        const std::string& s = node_.Scalar();
        if (s == "true" || s == "True") return true;
        if (s == "false" || s == "False") return false;
    }
    fail(fmt::format("{} must be true or false", what));
}

std::vector<YamlNode> YamlNode::items(const std::string& what) const {
    if (!node_.IsSequence()) fail(fmt::format("{} must be a list", what));
    std::vector<YamlNode> out;
    for (const auto& item : node_) out.emplace_back(item, file_);
    return out;
}

Shape YamlNode::as_shape(const std::string& what) const {
    Shape s;
    for (const YamlNode& d : items(what)) s.push_back(d.as_positive_int(what + " entries"));
    if (s.empty() || s.size() > 8) fail(fmt::format("{} must have 1 to 8 dims", what));
    int64_t n = 1;
    for (int64_t d : s) {
        if (n > (int64_t{1} << 40) / d) fail(fmt::format("{} is too large", what));
        n *= d;
    }
    return s;
}

std::string YamlNode::text() const {
    YAML::Emitter out;
    out << node_;
    return out.c_str();
}

YamlMap::YamlMap(const YamlNode& node, std::string what) : node_(node), what_(std::move(what)) {
    if (!node.is_map()) node.fail(fmt::format("{} must be a map of keys", what_));
    for (const auto& kv : node.raw())
        entries_.push_back({YamlNode(kv.first, node.file_).as_string("a key"), kv.first, kv.second});
    // the first key in document order that repeats an earlier one: sorted by key (then place), the
    // least place that follows an equal key
    std::vector<size_t> order(entries_.size());
    std::iota(order.begin(), order.end(), size_t{0});
    std::stable_sort(order.begin(), order.end(),
                     [&](size_t a, size_t b) { return entries_[a].key < entries_[b].key; });
    size_t repeat = entries_.size();
    for (size_t i = 1; i < order.size(); ++i)
        if (entries_[order[i]].key == entries_[order[i - 1]].key) repeat = std::min(repeat, order[i]);
    if (repeat < entries_.size())
        YamlNode(entries_[repeat].node, node.file_)
            .fail(fmt::format("duplicate key '{}' in {}", entries_[repeat].key, what_));
}

const YamlMap::Entry* YamlMap::find(const std::string& key) {
    if (std::find(queried_.begin(), queried_.end(), key) == queried_.end()) queried_.push_back(key);
    for (Entry& e : entries_)
        if (e.key == key) {
            e.asked = true;
            return &e;
        }
    return nullptr;
}

bool YamlMap::has(const std::string& key) {
    return find(key) != nullptr;
}

std::optional<YamlNode> YamlMap::get(const std::string& key) {
    const Entry* e = find(key);
    if (!e) return std::nullopt;
    return YamlNode(e->value, node_.file_);
}

YamlNode YamlMap::at(const std::string& key) {
    auto v = get(key);
    if (v) return *v;
    for (const Entry& e : entries_) {  // a near miss among the keys nobody asked for is a typo of this one
        if (e.asked || closest_match(e.key, {key}).empty()) continue;
        YamlNode(e.node, node_.file_)
            .fail(fmt::format("unknown key '{}' in {} (did you mean '{}'?)", e.key, what_, key));
    }
    node_.fail(fmt::format("{} is missing the key '{}'", what_, key));
}

std::string YamlMap::string_or(const std::string& key, const std::string& fallback) {
    auto v = get(key);
    return v ? v->as_string(fmt::format("'{}' of {}", key, what_)) : fallback;
}

int64_t YamlMap::int_or(const std::string& key, int64_t fallback) {
    auto v = get(key);
    return v ? v->as_int(fmt::format("'{}' of {}", key, what_)) : fallback;
}

double YamlMap::double_or(const std::string& key, double fallback) {
    auto v = get(key);
    return v ? v->as_double(fmt::format("'{}' of {}", key, what_)) : fallback;
}

bool YamlMap::bool_or(const std::string& key, bool fallback) {
    auto v = get(key);
    return v ? v->as_bool(fmt::format("'{}' of {}", key, what_)) : fallback;
}

void YamlMap::finish() const {
    std::vector<std::string> known(queried_.begin(), queried_.end());
    std::sort(known.begin(), known.end());
    for (const Entry& e : entries_) {
        if (e.asked) continue;
        YamlNode(e.node, node_.file_)
            .fail(fmt::format("unknown key '{}' in {}{}", e.key, what_, did_you_mean(e.key, known)));
    }
}

namespace {

// yaml-cpp's parse of one document (the caller ensured there is no second), its top level a map.
YamlNode parse_document(const std::string& text, const std::shared_ptr<const std::string>& file) {
    YAML::Node root;
    try {
        root = YAML::Load(text);
    } catch (const YAML::Exception& e) {
        throw InputError(SourceLocation{*file, e.mark.line + 1, e.mark.column + 1}, e.msg);
    }
    YamlNode out(root, file);
    if (!root.IsMap()) {
        if (root.IsNull()) throw InputError(SourceLocation{*file, 1, 1}, "file is empty");
        out.fail("the top level must be a map of keys");
    }
    return out;
}

}  // namespace

// One document, parsed and checked.
YamlNode load_yaml_text(const std::string& text, const std::string& name, const YamlLimits& limits) {
    prescan(text, name, limits);
    check_documents(text, name);
    auto file = std::make_shared<const std::string>(name);
    YamlNode out = parse_document(text, file);  // one document: check_documents refused a second
    TreeCheck{file, limits, 0, {}}.check(out.raw());
    return out;
}

YamlNode load_emitted_yaml(const std::string& text, const std::string& name) {
    // the size limit still holds: a plan written for a model's many long names can outgrow what a
    // plan file may be, and one the planner accepted would not load back from its file
    check_size(text, name, YamlLimits{});
    return parse_document(text, std::make_shared<const std::string>(name));
}

std::string closest_match(const std::string& word, const std::vector<std::string>& candidates) {
    std::string best;
    size_t best_d = std::max<size_t>(2, word.size() / 3) + 1;
    for (const auto& c : candidates) {
        size_t d = edit_distance(word, c);
        if (d < best_d) best_d = d, best = c;
    }
    return best;
}

namespace {

// Whether a node of `n` is reached twice (an alias): a parsed node's mark is where it starts in the
// text, which with its type is one node's (a block map starts where its first key does), so a place
// and type seen again are the same node named again.
bool has_alias(const YAML::Node& n, std::set<std::tuple<int, int, int>>& seen) {
    if (!n || !n.IsDefined()) return false;
    const YAML::Mark m = n.Mark();
    if (!m.is_null() && !seen.emplace(m.line, m.column, static_cast<int>(n.Type())).second) return true;
    if (n.IsSequence())
        for (const YAML::Node& c : n)
            if (has_alias(c, seen)) return true;
    if (n.IsMap())
        for (const auto& kv : n)
            if (has_alias(kv.first, seen) || has_alias(kv.second, seen)) return true;
    return false;
}

YAML::Node copied(const YAML::Node& n) {
    if (n.IsSequence() || n.IsMap()) {
        YAML::Node out(n.IsSequence() ? YAML::NodeType::Sequence : YAML::NodeType::Map);
        out.SetStyle(n.Style());
        if (n.IsSequence())
            for (const YAML::Node& c : n) out.push_back(copied(c));
        else
            for (const auto& kv : n) out.force_insert(copied(kv.first), copied(kv.second));
        return out;
    }
    if (!n.IsScalar()) return YAML::Node(n.Type());
    YAML::Node out(n.Scalar());
    out.SetTag(n.Tag());
    return out;
}

}  // namespace

YAML::Node yaml_unaliased(const YAML::Node& doc) {
    std::set<std::tuple<int, int, int>> seen;
    return has_alias(doc, seen) ? copied(doc) : doc;
}

std::string did_you_mean(const std::string& word, const std::vector<std::string>& candidates) {
    std::string m = closest_match(word, candidates);
    if (!m.empty()) return fmt::format(" (did you mean '{}'?)", m);
    if (candidates.empty()) return "";
    return fmt::format(" (valid: {})", fmt::join(candidates, ", "));
}

}  // namespace ptool
