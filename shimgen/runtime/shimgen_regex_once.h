// std::regex's two largest templates, declared as instantiated elsewhere. AOTInductor's model_base.h calls std::regex
// in an inline function (parse_device_str), and g++ instantiates what inline functions use at the end of every
// translation unit that includes them, called or not: about 0.6 s of each model.cpp's compile, precompiled header or
// not. The prebuilt model base object instantiates them once (SHIMGEN_REGEX_ONCE(template)), beside the model base
// class. Declared only where <regex> is already included (nothing to parse otherwise), and for the libstdc++ releases
// that have these internal names and this signature (12 through 16).
#pragma once
#if defined(_GLIBCXX_REGEX) && defined(_GLIBCXX_RELEASE) && _GLIBCXX_RELEASE >= 12 && _GLIBCXX_RELEASE <= 16
#define SHIMGEN_REGEX_ONCE(how)                                                                                   \
  how class std::__detail::_Compiler<std::regex_traits<char>>;                                                   \
  how bool std::__detail::__regex_algo_impl<std::string::const_iterator,                                         \
                                            std::allocator<std::sub_match<std::string::const_iterator>>, char,   \
                                            std::regex_traits<char>>(                                            \
      std::string::const_iterator, std::string::const_iterator, std::match_results<std::string::const_iterator>&, \
      const std::basic_regex<char>&, std::regex_constants::match_flag_type, std::__detail::_RegexExecutorPolicy, bool);
SHIMGEN_REGEX_ONCE(extern template)
#endif
