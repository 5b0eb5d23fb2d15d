/* KLEIN_API marks the symbols libklein exports. The library is built with -fvisibility=hidden,
 * so everything else (the engine internals) stays private to the shared object. Included by
 * both the C++ and the C header, hence C comments. */
#ifndef KLEIN_EXPORT_H_
#define KLEIN_EXPORT_H_

#if defined(_WIN32)
#if defined(KLEIN_BUILDING_LIBRARY)
#define KLEIN_API __declspec(dllexport)
#else
#define KLEIN_API __declspec(dllimport)
#endif
#elif (defined(__GNUC__) || defined(__clang__)) && defined(__cplusplus)
/* The standard attribute syntax, so it can follow [[nodiscard]] in a class head. */
#define KLEIN_API [[gnu::visibility("default")]]
#elif defined(__GNUC__) || defined(__clang__)
#define KLEIN_API __attribute__((visibility("default")))
#else
#define KLEIN_API
#endif

#endif /* KLEIN_EXPORT_H_ */
