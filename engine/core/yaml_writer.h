// Text that ptool writes into YAML files: models (`import hf`), plans (`plan -o`, `import
// hf-tp-plan`) and proxies (`shrink`). Every string in them that came from an input (a config's
// field, a tp-plan key, a module name, a cluster's name, a file name) goes through yaml-cpp's
// emitter, double-quoted with everything but printable ASCII escaped, so no newline, quote or
// line separator in it can end the scalar and add a key; a comment holds it only as one line of
// printable ASCII (else its quoted form). Both read back as the same string in yaml-cpp and in
// PyYAML (YAML 1.1, whose line breaks include U+0085, U+2028 and U+2029).
#pragma once

#include <string>

namespace ptool {

std::string yaml_quoted(const std::string& s);  // "a\nb": the emitter's double-quoted scalar
// s itself when it is a word YAML reads as that string and nothing else (letters, digits, '_',
// '-', '.', starting with a letter or '_'; not a YAML 1.1 boolean or null), else yaml_quoted(s)
std::string yaml_scalar(const std::string& s);
std::string yaml_comment(
    const std::string& s);  // s when printable ASCII, else yaml_quoted(s): one comment line

}  // namespace ptool
